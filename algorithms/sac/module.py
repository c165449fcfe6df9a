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
from typing import Any, Dict, List

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from raylab.algorithms.sac.update import LOG_STD_MIN, mlp, policy_inputs, q_pair


class RaylabSACModule(TorchRLModule, InferenceOnlyAPI, TargetNetworkAPI, QNetAPI):
    def setup(self) -> None:
        obs_dim = int(math.prod(self.observation_space.shape))
        self.action_dim = int(math.prod(self.action_space.shape))
        hidden = list(self.model_config.get("fcnet_hiddens", [256, 256]))
        activation = self.model_config.get("fcnet_activation", "relu")
        self.pi = mlp(obs_dim, hidden, 2 * self.action_dim, activation)
        # The policy's bounds (algo.log_std_min, algo.mean_bound): in the model config, so a
        # module restored from a checkpoint samples within the bounds it was trained with.
        self.log_std_min = float(self.model_config.get("log_std_min", LOG_STD_MIN))
        bound = self.model_config.get("mean_bound")
        self.mean_bound = None if bound is None else float(bound)
        if not self.inference_only:
            self.qf = mlp(obs_dim + self.action_dim, hidden, 1, activation)
            self.qf_twin = mlp(obs_dim + self.action_dim, hidden, 1, activation)

    # ---- policy ---------------------------------------------------------------------------
    def policy_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        return policy_inputs(self.pi, obs, self.log_std_min, self.mean_bound)

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
        if target:
            return q_pair(self.target_qf, self.target_qf_twin, obs, actions)
        return q_pair(self.qf, self.qf_twin, obs, actions)

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
