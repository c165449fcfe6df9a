"""Probe environments: tiny Gymnasium envs whose statistics are known in advance, for checking
what the training pipeline reports (not for learning).

``raylab/CountingEpisodes-v0``: every episode lasts ``length`` steps and pays, on its last step,
its own ordinal within this env instance (the first episode returns 1, the second 2, ...), so
the returns any report should average are known from the step counts alone. Observation and
action are one number each; the action is ignored.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CountingEpisodesEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 10):
        if int(length) < 1:
            raise ValueError(f"length={length}: must be at least 1")
        self.length = int(length)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t = 0
        self._episodes = 0  # completed in this instance

    def _obs(self) -> np.ndarray:
        return np.array([self._t / self.length], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        done = self._t >= self.length
        reward = 0.0
        if done:
            self._episodes += 1
            reward = float(self._episodes)
        return self._obs(), reward, done, False, {}
