"""raylab's RLModules.

:class:`AsymmetricPPOModule`: RLlib's default PPO module whose policy sees only the first
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
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT

ACTOR_OBS_DIM = "actor_obs_dim"  # model_config key


class AsymmetricPPOModule(DefaultPPOTorchRLModule):
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
