"""raylab's RLModules.

:class:`AsymmetricPPOModule` / :class:`AsymmetricAPPOModule`: RLlib's default PPO / APPO
module, with two options. ``algo.max_log_std`` bounds the policy's log std softly
(``max - softplus(max - raw)``: close to the raw output well below the bound, never above it),
so that a policy trained without an entropy bonus on clipped actions cannot widen its sampling
distribution until every sampled action saturates; with ``algo.final_max_log_std`` the bound
is a buffer of the module that the Learner moves linearly to that value by the end of the run:
at ``training.total_steps`` env steps or, with ``training.time_budget_s``, at the end of the
budget, whichever comes first (:func:`scheduled_log_std_bound`; the seconds count on the
Learner's clock from its first update and are a buffer too, so a resumed run goes on where it
stopped), so the policy learns to
act with little noise late in training and its mean action becomes the controller that
evaluation runs; the buffer travels with the weights like the observation statistics below.
And its policy sees only the first
``actor_obs_dim`` observation entries, while the value function sees all of them. A task with
``env.privileged_obs=true`` appends privileged state (true trunk velocity, height, foot contacts)
after the policy's observation; the critic's value estimates use it, the policy (what runs on
a robot) never does. The hidden entries are zeroed before the policy's encoder, so its weights
on them never receive a gradient and do not matter. RLlib builds this module everywhere its
default one would be built (EnvRunners, Learners, checkpoints, ``raylab eval``).

``algo.normalize_obs`` puts a :class:`RunningObsNorm` in front of both paths: observations are
shifted and scaled by the running mean and std of every observation trained on, then clipped to
[-10, 10]. The statistics are buffers of the module, so they travel with the weights: the
EnvRunners act, the evaluation evaluates and a checkpoint restores with exactly the statistics
of the weights they hold, and nothing else has to be synchronised. The Learner collects the update's
valid steps (which come from every EnvRunner; PPO's Learner once per update, each sampled
observation once, APPO's per batch it trains on) and merges them into the statistics once the
whole update is done: during an update every minibatch is
normalised exactly as the EnvRunners normalised it when they sampled it (the statistics they
held), so the probability ratios start at 1. Updating after every minibatch instead moved the
normalisation under the policy within one update, most of all early on, when the first 64
observations replaced the identity.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.rl_module.apis.target_network_api import TARGET_NETWORK_ACTION_DIST_INPUTS

from raylab.algorithms.rllib_compat import old_policy

ACTOR_OBS_DIM = "actor_obs_dim"  # model_config keys
MAX_LOG_STD = "max_log_std"
FINAL_MAX_LOG_STD = "final_max_log_std"
SCHEDULE_STEPS = "log_std_schedule_steps"
SCHEDULE_SECONDS = "log_std_schedule_seconds"
NORMALIZE_OBS = "normalize_obs"
SCALE_REWARDS = "scale_rewards"
OBS_CLIP = 10.0  # normalised observations are clipped to [-OBS_CLIP, OBS_CLIP]


class RunningObsNorm(torch.nn.Module):
    """Running mean and variance of observations (float64 buffers), and the normalisation
    ``clip((obs - mean) / sqrt(var + eps), -OBS_CLIP, OBS_CLIP)``. Before any update it is the
    identity up to the clip (mean 0, variance 1)."""

    def __init__(self, dim: int, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self._pending = None  # (count, sum, sum of squares) collected since the last commit
        self._cache = [None, None]  # float32 (mean, std) with the buffers' versions, per mode

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean, std = self._float32()
        return torch.clamp((obs - mean) / std, -OBS_CLIP, OBS_CLIP).to(obs.dtype)

    def _float32(self):
        # In float32 from float32 statistics: RLlib hands module state on (weight syncs,
        # checkpoints) as float32, so a module that received them normalises exactly as the
        # Learner's own does. Kept until the buffers change (their in-place version counters:
        # a merge, a weight sync, a restore), per inference mode (a tensor made under
        # inference mode cannot enter autograd).
        key = (self.mean._version, self.var._version, self.mean.data_ptr(), self.var.data_ptr())
        slot = 1 if torch.is_inference_mode_enabled() else 0
        cached = self._cache[slot]
        if cached is None or cached[0] != key:
            mean = self.mean.to(torch.float32)
            cached = (key, mean, torch.sqrt(self.var.to(torch.float32) + self.eps))
            self._cache[slot] = cached
        return cached[1], cached[2]

    @staticmethod
    def _rows(obs: torch.Tensor, mask=None) -> torch.Tensor:
        x = obs.reshape(-1, obs.shape[-1]).to(torch.float64)
        return x if mask is None else x[mask.reshape(-1).bool()]

    @torch.no_grad()
    def update(self, obs: torch.Tensor, mask=None) -> None:
        """Merge the statistics of ``obs`` (rows where ``mask`` is true) into the running ones
        now."""
        x = self._rows(obs, mask)
        if x.shape[0]:
            self._merge(x.shape[0], x.mean(dim=0), x.var(dim=0, unbiased=False))

    @torch.no_grad()
    def collect(self, obs: torch.Tensor, mask=None) -> None:
        """Keep the rows of ``obs`` (where ``mask`` is true) for the next :meth:`commit`; the
        normalisation does not change until then."""
        x = self._rows(obs, mask)
        if not x.shape[0]:
            return
        part = (x.shape[0], x.sum(dim=0), (x * x).sum(dim=0))
        p = self._pending
        self._pending = part if p is None else (p[0] + part[0], p[1] + part[1], p[2] + part[2])

    @torch.no_grad()
    def commit(self) -> None:
        """Merge every row collected since the last commit into the running statistics. With
        several Learners (a torch.distributed group) the rows of every Learner join, so all of
        them hold equal statistics, as they hold equal weights; every Learner must call it."""
        pending, self._pending = self._pending, None
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            dim = self.mean.shape[0]
            flat = torch.zeros(1 + 2 * dim, dtype=torch.float64, device=self.mean.device)
            if pending is not None:
                flat[0] = pending[0]
                flat[1 : 1 + dim] = pending[1]
                flat[1 + dim :] = pending[2]
            torch.distributed.all_reduce(flat)
            n = float(flat[0])
            pending = (n, flat[1 : 1 + dim], flat[1 + dim :]) if n > 0 else None
        if pending is None:
            return
        n, total, squares = pending
        mean = total / n
        self._merge(n, mean, torch.clamp(squares / n - mean * mean, min=0.0))

    def _merge(self, n: int, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> None:
        """Chan et al.'s parallel update: the result equals the statistics of all rows seen."""
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


def bound_log_std(dist_inputs: torch.Tensor, max_log_std) -> torch.Tensor:
    """[mean, log_std] with log_std softly bounded above by ``max_log_std`` (None: as is)."""
    if max_log_std is None:
        return dist_inputs
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    bound = max_log_std if torch.is_tensor(max_log_std) else float(max_log_std)
    return torch.cat([mean, bound - torch.nn.functional.softplus(bound - log_std)], dim=-1)


def scheduled_log_std_bound(
    start: float,
    final: float,
    steps: int,
    env_steps: int,
    seconds: float | None = None,
    elapsed_s: float = 0.0,
) -> float:
    """The log-std bound after ``env_steps`` env steps (and ``elapsed_s`` seconds of a run with
    a ``seconds`` budget): linear from ``start`` at 0 to ``final`` at ``steps`` or at
    ``seconds``, whichever the run reaches first, then constant."""
    frac = env_steps / max(1, steps)
    if seconds:
        frac = max(frac, elapsed_s / float(seconds))
    return start + (final - start) * min(1.0, max(0.0, frac))


class _Asymmetric:
    """The policy path on the policy's entries, the value path on all of them; both on the
    normalised observation with ``normalize_obs``."""

    def setup(self) -> None:
        super().setup()
        # (An nn.Module attribute, not a class one: a class attribute would shadow it.)
        self.obs_norm = (
            RunningObsNorm(int(self.observation_space.shape[-1]))
            if self.model_config.get(NORMALIZE_OBS)
            else None
        )
        # algo.scale_rewards: the discounted returns' statistics (raylab.algorithms.reward_scaling)
        self.return_norm = RunningObsNorm(1) if self.model_config.get(SCALE_REWARDS) else None
        # algo.final_max_log_std: the scheduled bound, moved by the Learner (set_log_std_bound)
        if self.model_config.get(FINAL_MAX_LOG_STD) is not None:
            start = float(self.model_config[MAX_LOG_STD])
            self.register_buffer("log_std_bound", torch.tensor(start, dtype=torch.float32))
            # seconds of the run the schedule has counted (training.time_budget_s)
            self.register_buffer("log_std_schedule_s", torch.zeros((), dtype=torch.float64))
        else:
            self.log_std_bound = None

    def set_log_std_bound(self, env_steps: int, add_seconds: float = 0.0) -> None:
        """Move the scheduled bound to where it is after ``env_steps`` env steps sampled and
        ``add_seconds`` more seconds of the run (counted only with a time budget)."""
        if self.log_std_bound is None:
            return
        seconds = self.model_config.get(SCHEDULE_SECONDS)
        if seconds:
            self.log_std_schedule_s.add_(max(0.0, float(add_seconds)))
        value = scheduled_log_std_bound(
            float(self.model_config[MAX_LOG_STD]),
            float(self.model_config[FINAL_MAX_LOG_STD]),
            int(self.model_config[SCHEDULE_STEPS]),
            env_steps,
            seconds,
            float(self.log_std_schedule_s),
        )
        self.log_std_bound.fill_(value)

    def _normalized(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if self.obs_norm is None:
            return batch
        return {**batch, Columns.OBS: self.obs_norm(batch[Columns.OBS])}

    def _actor_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if self.model_config.get(ACTOR_OBS_DIM) is None:  # no privileged part
            return batch
        obs = batch[Columns.OBS]
        k = int(self.model_config[ACTOR_OBS_DIM])
        hidden = torch.zeros_like(obs[..., k:])
        return {**batch, Columns.OBS: torch.cat([obs[..., :k], hidden], dim=-1)}

    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self._policy(self._normalized(batch))

    def explore(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """RLlib's ``forward_exploration`` for a module kept in eval mode (an EnvRunner's):
        the same pass without setting every submodule's mode twice per call, which took a
        tenth of a HalfCheetah EnvRunner's sampling time."""
        with torch.no_grad():
            return self._forward_exploration(batch)

    def _policy(self, normalized: Dict[str, Any]) -> Dict[str, Any]:
        actor = self.encoder.actor_encoder(self._actor_batch(normalized))[ENCODER_OUT]
        return {Columns.ACTION_DIST_INPUTS: self._bounded(self.pi(actor))}

    def _bounded(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        if self.log_std_bound is not None:
            return bound_log_std(dist_inputs, self.log_std_bound)
        return bound_log_std(dist_inputs, self.model_config.get(MAX_LOG_STD))

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        batch = self._normalized(batch)
        out = self._policy(batch)
        out[Columns.EMBEDDINGS] = self.encoder.critic_encoder(batch)[ENCODER_OUT]
        return out

    def compute_values(self, batch: Dict[str, Any], embeddings=None):
        if embeddings is None:
            batch = self._normalized(batch)
        return super().compute_values(batch, embeddings)


class AsymmetricPPOModule(_Asymmetric, DefaultPPOTorchRLModule):
    pass


class AsymmetricAPPOModule(_Asymmetric, DefaultAPPOTorchRLModule):
    def forward_target(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        # APPO's old (target) policy sees what the policy sees.
        encoder, pi = old_policy(self)
        old = encoder.actor_encoder(self._actor_batch(self._normalized(batch)))[ENCODER_OUT]
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: self._bounded(pi(old))}


MODULES = {"ppo": AsymmetricPPOModule, "appo": AsymmetricAPPOModule}
