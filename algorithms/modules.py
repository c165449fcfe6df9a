"""raylab's RLModules.

:class:`AsymmetricPPOModule` / :class:`AsymmetricAPPOModule`: RLlib's default PPO / APPO
module whose policy sees only the first
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

ACTOR_OBS_DIM = "actor_obs_dim"  # model_config key


class _Asymmetric:
    """The policy path on the policy's entries, the value path on all of them."""

    def _actor_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        obs = batch[Columns.OBS]
        k = int(self.model_config[ACTOR_OBS_DIM])
        hidden = torch.zeros_like(obs[..., k:])
        return {**batch, Columns.OBS: torch.cat([obs[..., :k], hidden], dim=-1)}

    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        actor = self.encoder.actor_encoder(self._actor_batch(batch))[ENCODER_OUT]
        return {Columns.ACTION_DIST_INPUTS: self.pi(actor)}

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        out = self._forward(batch)
        out[Columns.EMBEDDINGS] = self.encoder.critic_encoder(batch)[ENCODER_OUT]
        return out


class AsymmetricPPOModule(_Asymmetric, DefaultPPOTorchRLModule):
    pass


class AsymmetricAPPOModule(_Asymmetric, DefaultAPPOTorchRLModule):
    def forward_target(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        # APPO's old (target) policy sees what the policy sees.
        old = self._old_encoder.actor_encoder(self._actor_batch(batch))[ENCODER_OUT]
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: self._old_pi(old)}


MODULES = {"ppo": AsymmetricPPOModule, "appo": AsymmetricAPPOModule}
