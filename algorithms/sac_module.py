"""raylab's SAC networks as an RLlib RLModule: a tanh-Gaussian policy and twin Q-functions.

Plain MLPs as in the SAC paper and CleanRL: the policy maps the observation to the mean and
log-std of a Gaussian squashed by tanh into [-1, 1]; each critic maps the concatenated
(observation, action) to one value; target critics are polyak-averaged copies. EnvRunners
build the inference-only part (the policy); checkpoints and ``raylab eval`` load it through
RLlib's ``RLModule.from_checkpoint`` like any other module.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Tuple

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}


def mlp(inputs: int, hidden: List[int], outputs: int, activation: str) -> nn.Sequential:
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
        width = h
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


def squashed_gaussian_sample(dist_inputs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised tanh-Gaussian sample in [-1, 1] and its log-probability."""
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    std = log_std.exp()
    noise = torch.randn_like(mean)
    pre_tanh = mean + std * noise
    action = torch.tanh(pre_tanh)
    log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
    # Change of variables for tanh, in the numerically stable form 2*(log2 - u - softplus(-2u)).
    log_prob = log_prob - (2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh))).sum(-1)
    return action, log_prob


class RaylabSACModule(TorchRLModule, InferenceOnlyAPI, TargetNetworkAPI, QNetAPI):
    def setup(self) -> None:
        obs_dim = int(math.prod(self.observation_space.shape))
        self.action_dim = int(math.prod(self.action_space.shape))
        hidden = list(self.model_config.get("fcnet_hiddens", [256, 256]))
        activation = self.model_config.get("fcnet_activation", "relu")
        self.pi = mlp(obs_dim, hidden, 2 * self.action_dim, activation)
        if not self.inference_only:
            self.qf = mlp(obs_dim + self.action_dim, hidden, 1, activation)
            self.qf_twin = mlp(obs_dim + self.action_dim, hidden, 1, activation)

    # ---- policy ---------------------------------------------------------------------------
    def policy_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.pi(obs.flatten(1)).chunk(2, dim=-1)
        return torch.cat([mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=-1)

    def _forward_inference(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.policy_inputs(batch[Columns.OBS])}

    def _forward_exploration(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self._forward_inference(batch)

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self._forward_inference(batch)

    def get_inference_action_dist_cls(self):
        return TorchSquashedGaussian

    def get_exploration_action_dist_cls(self):
        return TorchSquashedGaussian

    def get_train_action_dist_cls(self):
        return TorchSquashedGaussian

    # ---- critics --------------------------------------------------------------------------
    def q_values(self, obs: torch.Tensor, actions: torch.Tensor, target: bool = False):
        x = torch.cat([obs.flatten(1), actions], dim=-1)
        if target:
            return self.target_qf(x).squeeze(-1), self.target_qf_twin(x).squeeze(-1)
        return self.qf(x).squeeze(-1), self.qf_twin(x).squeeze(-1)

    def compute_q_values(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        q1, q2 = self.q_values(batch[Columns.OBS], batch[Columns.ACTIONS])
        return torch.min(q1, q2)

    def make_target_networks(self) -> None:
        self.target_qf = copy.deepcopy(self.qf)
        self.target_qf_twin = copy.deepcopy(self.qf_twin)
        for p in list(self.target_qf.parameters()) + list(self.target_qf_twin.parameters()):
            p.requires_grad_(False)

    def get_target_network_pairs(self):
        return [(self.qf, self.target_qf), (self.qf_twin, self.target_qf_twin)]

    def forward_target(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        q1, q2 = self.q_values(batch[Columns.OBS], batch[Columns.ACTIONS], target=True)
        return torch.min(q1, q2)

    def get_non_inference_attributes(self) -> List[str]:
        return ["qf", "qf_twin", "target_qf", "target_qf_twin"]
