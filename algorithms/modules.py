"""raylab's RLModules.

:class:`AsymmetricPPOModule` / :class:`AsymmetricAPPOModule`: RLlib's default PPO / APPO
module, with two options. ``algo.max_log_std`` bounds the policy's log std softly
(``max - softplus(max - raw)``: close to the raw output well below the bound, never above it),
so that a policy trained without an entropy bonus on clipped actions cannot widen its sampling
distribution until every sampled action saturates. And its policy sees only the first
``actor_obs_dim`` observation entries, while the value function sees all of them. A task with
``env.privileged_obs=true`` appends privileged state (true trunk velocity, height, foot contacts)
after the policy's observation; the critic's value estimates use it, the policy (what runs on
a robot) never does. The hidden entries are zeroed before the policy's encoder, so its weights
on them never receive a gradient and do not matter. RLlib builds this module everywhere its
default one would be built (EnvRunners, Learners, checkpoints, ``raylab eval``).
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


def bound_log_std(dist_inputs: torch.Tensor, max_log_std) -> torch.Tensor:
    """[mean, log_std] with log_std softly bounded above by ``max_log_std`` (None: as is)."""
    if max_log_std is None:
        return dist_inputs
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    bound = float(max_log_std)
    return torch.cat([mean, bound - torch.nn.functional.softplus(bound - log_std)], dim=-1)


class _Asymmetric:
    """The policy path on the policy's entries, the value path on all of them."""

    def _actor_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if self.model_config.get(ACTOR_OBS_DIM) is None:  # no privileged part
            return batch
        obs = batch[Columns.OBS]
        k = int(self.model_config[ACTOR_OBS_DIM])
        hidden = torch.zeros_like(obs[..., k:])
        return {**batch, Columns.OBS: torch.cat([obs[..., :k], hidden], dim=-1)}

    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        actor = self.encoder.actor_encoder(self._actor_batch(batch))[ENCODER_OUT]
        return {Columns.ACTION_DIST_INPUTS: self._bounded(self.pi(actor))}

    def _bounded(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        return bound_log_std(dist_inputs, self.model_config.get(MAX_LOG_STD))

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        out = self._forward(batch)
        out[Columns.EMBEDDINGS] = self.encoder.critic_encoder(batch)[ENCODER_OUT]
        return out


class AsymmetricPPOModule(_Asymmetric, DefaultPPOTorchRLModule):
    pass


class AsymmetricAPPOModule(_Asymmetric, DefaultAPPOTorchRLModule):
    def forward_target(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        # APPO's old (target) policy sees what the policy sees.
        encoder, pi = old_policy(self)
        old = encoder.actor_encoder(self._actor_batch(batch))[ENCODER_OUT]
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: self._bounded(pi(old))}


MODULES = {"ppo": AsymmetricPPOModule, "appo": AsymmetricAPPOModule}
