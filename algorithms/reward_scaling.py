"""``algo.scale_rewards`` (PPO / APPO): rewards divided by the running std of the discounted
return, the reward scaling of the common PPO implementations for tasks whose returns run into
the thousands.

:class:`ScaleRewardsByReturnStd` is a learner connector piece, placed before RLlib's default
learner pipeline, so the value targets and advantages are computed from the scaled rewards;
the EnvRunners and every reported return (``Train/*``, ``Eval/*``) keep the task's own
rewards. For each episode chunk in the train batch it continues that episode's discounted
return (gamma of the algorithm; the sum so far is kept per episode id until the episode ends),
merges the chunk's running returns into the statistics, and scales the chunk's rewards by
``1 / sqrt(var + eps)``. The statistics are a buffer of the RLModule
(``raylab.algorithms.modules``, ``return_norm``), so they are saved and restored with the
checkpoint like the weights.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID

OPEN_EPISODES_MAX = 100_000  # episode ids whose return is kept; the oldest go first

# Writing the scaled rewards back into a finalised episode makes RLlib check each one against
# the reward space with a NumPy scalar, and Gymnasium warns that it casts it: every train batch,
# in the Learner's output. The values are float32 arrays already; the warning says nothing.
warnings.filterwarnings("ignore", message=".*Casting input x to numpy array", category=UserWarning)


class ScaleRewardsByReturnStd(ConnectorV2):
    def __init__(self, input_observation_space=None, input_action_space=None, *, gamma: float):
        super().__init__(input_observation_space, input_action_space)
        self.gamma = float(gamma)
        self._open: Dict[str, float] = {}  # episode id -> discounted return so far

    def __call__(self, *, rl_module, batch: Dict[str, Any], episodes: List[Any], **kwargs):
        module = rl_module[DEFAULT_MODULE_ID]
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        norm = getattr(module, "return_norm", None)
        if norm is None:
            return batch
        chunks = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
        rewards = [np.asarray(ep.get_rewards(), dtype=np.float64) for ep in chunks]
        returns = []
        for ep, r in zip(chunks, rewards):
            g = self._open.pop(ep.id_, 0.0)
            out = np.empty_like(r)
            for t, x in enumerate(r):
                g = self.gamma * g + x
                out[t] = g
            returns.append(out)
            if not ep.is_done:
                self._open[ep.id_] = g
        while len(self._open) > OPEN_EPISODES_MAX:
            self._open.pop(next(iter(self._open)))
        if returns:
            norm.update(torch.as_tensor(np.concatenate(returns))[:, None])
        scale = 1.0 / float(torch.sqrt(norm.var[0] + norm.eps))
        for ep, r in zip(chunks, rewards):
            if len(r):
                ep.set_rewards(new_data=(r * scale).astype(np.float32), at_indices=slice(0, len(r)))
        return batch
