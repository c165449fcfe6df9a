"""raylab's rollout loop for batched envs: one forward pass and one env step per vector step.

RLlib's ``SingleAgentEnvRunner`` pays, on every vector step, its env-to-module and
module-to-env connector pipelines and one episode object update per env. For raylab's batched
envs that Python costs more than the policy itself. :class:`RolloutLoop` does per step only
what the step needs:

1. one torch forward of the module on the whole (N, obs) batch, one sample (and log-prob) from
   its action distribution (with ``noise_correlation`` > 0, a diagonal Gaussian's sample is
   mean + std x a per-env noise that follows an AR(1) process over the episode's steps:
   ``algo.noise_correlation``, :func:`correlated_noise`);
2. the env's actions on the whole batch, exactly as RLlib's ``NormalizeAndClipActions`` makes
   them: ``low + (a + 1) * (high - low) / 2``, clipped to the bounds;
3. one ``env.step``; its outputs are written into preallocated (T, N, ...) arrays.

Everything per episode (returns, lengths, boundaries, episode objects for PPO / APPO, flat
transitions for SAC) is done once per fragment from those arrays. The env autoresets
NEXT_STEP (Gymnasium's default, what RLlib expects): the step after an episode ends resets that
env and returns its first observation, which is not a transition (``valid`` is False there).

Used by :class:`raylab.algorithms.env_runner.RaylabFastEnvRunner` (PPO, APPO: episode chunks for
RLlib's learner connectors) and :class:`raylab.algorithms.sac.RaylabSACEnvRunner` (SAC: flat
transitions for the learner's replay).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from ray.rllib.core.columns import Columns

from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics.timeline import label

# A traced Env Step's nested parts: (schema tag, indices into the env's last_step_marks).
_NESTED_SPANS = (
    (S.PERF_COLLECTOR_ACTION_VALIDATE_MS, 0, 1),
    (S.PERF_COLLECTOR_RESET_DONE_MS, 1, 2),
    (S.PERF_COLLECTOR_APPLY_ACTION_MS, 2, 3),
    (S.PERF_COLLECTOR_BACKEND_STEP_MS, 3, 4),
    (S.PERF_COLLECTOR_UPDATE_STATE_MS, 4, 5),
    (S.PERF_COLLECTOR_RESET_DONE_MS, 5, 6),
)
_INFER, _STEP = label(S.PERF_COLLECTOR_MLP_INFER_MS), label(S.PERF_COLLECTOR_ENV_STEP_MS)
_NESTED_LABELS = tuple((label(tag), a, b) for tag, a, b in _NESTED_SPANS)


@dataclass
class Fragment:
    """T vector steps of N envs. ``obs[t]`` is what the policy saw at step t, ``obs[T]`` the
    observation after the last step; step t's transition is (obs[t], actions[t], rewards[t],
    obs[t + 1]) where ``valid[t]``."""

    obs: np.ndarray  # (T + 1, N, *obs_shape)
    actions: np.ndarray  # (T, N, *act_shape), as sampled (RLlib's Columns.ACTIONS)
    logp: Optional[np.ndarray]  # (T, N) float32, or None when not asked for
    dist_inputs: Optional[np.ndarray]  # (T, N, K) float32, or None
    rewards: np.ndarray  # (T, N) float64
    terminated: np.ndarray  # (T, N) bool
    truncated: np.ndarray  # (T, N) bool
    valid: np.ndarray  # (T, N) bool: False where this step reset the env (no transition)
    episodes: List[Tuple[int, int, float, bool]]  # finished: (env, length, return, truncated)

    @property
    def num_steps(self) -> int:
        """Env steps that were transitions (what RLlib counts as sampled)."""
        return int(self.valid.sum())


def env_actions(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The env's actions from the policy's [-1, 1] ones, as RLlib's ``unsquash_action``."""
    return np.clip(low + (actions + 1.0) * (high - low) / 2.0, low, high)


class RolloutLoop:
    """Steps one batched env with one RLModule and keeps the per-env episode state between
    fragments.

    ``policy`` is the module's ``forward_exploration``; ``dist_cls`` its exploration action
    distribution class. ``tracker`` receives the canonical collector phases of every step, once
    per fragment.
    """

    def __init__(self, env, tracker=None):
        self.env = env
        self.tracker = tracker
        self.num_envs = int(env.num_envs)
        space = env.single_action_space
        self.low = space.low.astype(space.dtype)
        self.high = space.high.astype(space.dtype)
        self.obs: Optional[np.ndarray] = None  # the next observation the policy acts on
        self.prev_done = np.zeros(self.num_envs, dtype=bool)  # reset by the next step
        self.ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_len = np.zeros(self.num_envs, dtype=np.int64)
        self.noise: Optional[torch.Tensor] = None  # (N, act) exploration noise (correlated)

    def reset(self, seed: Optional[int] = None) -> None:
        self.obs, _ = self.env.reset(seed=seed)
        self.prev_done[:] = False
        self.ep_return[:] = 0.0
        self.ep_len[:] = 0
        self.noise = None

    @property
    def needs_reset(self) -> bool:
        return self.obs is None

    def run(
        self,
        policy: Optional[Callable[[dict], dict]],
        dist_cls=None,
        *,
        steps: Optional[int] = None,
        min_transitions: Optional[int] = None,
        with_logp: bool = True,
        random_action: Optional[Callable[[int], np.ndarray]] = None,
        random_steps: int = 0,
        noise_correlation: float = 0.0,
    ) -> Fragment:
        """Run ``steps`` vector steps, or as many as it takes to collect ``min_transitions``
        transitions (whole vector steps, as RLlib's loop counts them). The first
        ``random_steps`` steps act with ``random_action(n)`` instead of the policy (SAC's
        warm-up); with ``policy=None`` every step does. ``noise_correlation`` (in [0, 1)):
        the correlation of a Gaussian policy's exploration noise from one step to the next
        (0: RLlib's independent draws)."""
        if self.obs is None:
            raise RuntimeError("RolloutLoop.run before reset")
        if (steps is None) == (min_transitions is None):
            raise ValueError("give exactly one of steps and min_transitions")
        n = self.num_envs
        # Capacity: the steps asked for, or the fewest that can yield min_transitions plus
        # two for reset steps; grown (rarely) if more resets land in the fragment.
        cap = int(steps) if steps is not None else -(-int(min_transitions) // n) + 2
        buf = _Buffers(cap, n, np.asarray(self.obs), self.low.shape, with_logp)
        t, collected = 0, 0
        tracer = trace.active()
        nested = trace.nested_track() if tracer is not None else None
        while (t < steps) if steps is not None else (collected < min_transitions):
            if t == buf.capacity:
                buf.grow()
            t0 = time.perf_counter()
            if t < random_steps or policy is None:
                buf.actions[t] = random_action(n)
            else:
                with torch.inference_mode():
                    obs_t = np.asarray(buf.obs[t], dtype=np.float32)  # a view for float32 envs
                    out = policy({Columns.OBS: torch.from_numpy(obs_t)})
                    inputs = out[Columns.ACTION_DIST_INPUTS]
                    dist = dist_cls.from_logits(inputs)
                    if noise_correlation > 0.0:
                        self.noise = correlated_noise(
                            self.noise, self.prev_done, noise_correlation, inputs.shape[-1] // 2
                        )
                        a = gaussian_sample(dist, self.noise)
                    else:
                        a = dist.sample()
                    buf.actions[t] = a.numpy()
                    if with_logp:
                        buf.logp[t] = dist.logp(a).numpy()
                        buf.dist_inputs_row(t, inputs.numpy())
            t1 = time.perf_counter()
            next_obs, reward, term, trunc, _ = self.env.step(
                env_actions(buf.actions[t], self.low, self.high)
            )
            t2 = time.perf_counter()
            buf.obs[t + 1] = next_obs
            buf.rewards[t] = reward
            buf.terminated[t] = term
            buf.truncated[t] = trunc
            buf.valid[t] = ~self.prev_done
            collected += n - int(self.prev_done.sum())
            self.prev_done = np.logical_or(term, trunc)
            buf.infer_ms[t] = (t1 - t0) * 1000.0
            buf.step_ms[t] = (t2 - t1) * 1000.0
            if tracer is not None:
                tracer.complete(_INFER, t0, t1, "collector")
                tracer.complete(_STEP, t1, t2, "collector")
                marks = getattr(self.env, "last_step_marks", None)
                if marks is not None:
                    for name, a, b in _NESTED_LABELS:
                        if marks[b] > marks[a]:
                            tracer.complete(name, marks[a], marks[b], "nested", track=nested)
            t += 1
        if self.tracker is not None:  # per step, recorded once per fragment
            self.tracker.scalar_series(
                **{
                    S.PERF_COLLECTOR_MLP_INFER_MS: buf.infer_ms[:t],
                    S.PERF_COLLECTOR_ENV_STEP_MS: buf.step_ms[:t],
                }
            )
        self.obs = buf.obs[t]
        obs, actions, logp, dist_inputs, rewards, terminated, truncated, valid = buf.trimmed(t)
        finished: List[Tuple[int, int, float, bool]] = []
        # Episode bookkeeping, once per fragment.
        r = np.where(valid, rewards, 0.0)
        done = (terminated | truncated) & valid
        for i in range(n):
            ends = np.flatnonzero(done[:, i])
            start = 0
            for e in ends:
                self.ep_return[i] += float(np.sum(r[start : e + 1, i]))
                self.ep_len[i] += int(np.count_nonzero(valid[start : e + 1, i]))
                finished.append(
                    (i, int(self.ep_len[i]), float(self.ep_return[i]), bool(truncated[e, i]))
                )
                self.ep_return[i] = 0.0
                self.ep_len[i] = 0
                start = e + 1
            self.ep_return[i] += float(np.sum(r[start:, i]))
            self.ep_len[i] += int(np.count_nonzero(valid[start:, i]))
        return Fragment(
            obs, actions, logp, dist_inputs, rewards, terminated, truncated, valid, finished
        )


def correlated_noise(
    prev: Optional[torch.Tensor], new_episode: np.ndarray, rho: float, dim: int
) -> torch.Tensor:
    """The next step's exploration noise of N envs: ``rho * prev + sqrt(1 - rho^2) * z``
    with z standard normal (torch's generator, like RLlib's own sampling), so every step's noise
    is standard normal and neighbouring steps correlate by ``rho`` (about 1 / (1 - rho) steps
    of memory). A fresh draw where ``new_episode`` (the env resets on this step) and when there
    is no previous noise."""
    z = torch.randn(len(new_episode), dim)
    if prev is None:
        return z
    out = rho * prev + math.sqrt(1.0 - rho * rho) * z
    fresh = torch.from_numpy(np.asarray(new_episode, dtype=bool))
    out[fresh] = z[fresh]
    return out


def gaussian_sample(dist, noise: torch.Tensor) -> torch.Tensor:
    """mean + std x noise for RLlib's diagonal Gaussian ``dist``: a sample of the same marginal
    distribution as ``dist.sample()``, so ``dist.logp`` of it is the density PPO's and APPO's
    ratios use."""
    normal = getattr(dist, "_dist", None)
    if not isinstance(normal, torch.distributions.Normal):
        raise TypeError(
            f"algo.noise_correlation needs a diagonal Gaussian policy; this one is "
            f"{type(dist).__name__}"
        )
    return normal.loc + normal.scale * noise


class _Buffers:
    """The preallocated (T, N, ...) arrays of one fragment."""

    def __init__(self, cap, n, obs0, act_shape, with_logp):
        self.capacity = cap
        self.obs = np.empty((cap + 1, n) + obs0.shape[1:], dtype=obs0.dtype)
        self.obs[0] = obs0
        self.actions = np.empty((cap, n) + act_shape, dtype=np.float32)
        self.logp = np.zeros((cap, n), dtype=np.float32) if with_logp else None
        self.dist_inputs = None
        self.rewards = np.empty((cap, n), dtype=np.float64)
        self.terminated = np.empty((cap, n), dtype=bool)
        self.truncated = np.empty((cap, n), dtype=bool)
        self.valid = np.empty((cap, n), dtype=bool)
        self.infer_ms = np.zeros(cap)  # per step: policy forward + sampling
        self.step_ms = np.zeros(cap)  # per step: env.step

    def dist_inputs_row(self, t, row):
        if self.dist_inputs is None:
            self.dist_inputs = np.zeros((self.capacity,) + row.shape, dtype=np.float32)
        self.dist_inputs[t] = row

    def grow(self):
        extra = max(2, self.capacity // 4)
        for name in (
            "obs",
            "actions",
            "logp",
            "dist_inputs",
            "rewards",
            "terminated",
            "truncated",
            "valid",
            "infer_ms",
            "step_ms",
        ):
            a = getattr(self, name)
            if a is not None:
                setattr(self, name, np.concatenate([a, np.empty((extra,) + a.shape[1:], a.dtype)]))
        self.capacity += extra

    def trimmed(self, t):
        cut = lambda a: None if a is None else a[:t]  # noqa: E731
        return (
            self.obs[: t + 1],
            self.actions[:t],
            cut(self.logp),
            cut(self.dist_inputs),
            self.rewards[:t],
            self.terminated[:t],
            self.truncated[:t],
            self.valid[:t],
        )
