"""``SingleEnv``: any batched task as a plain ``gymnasium.Env`` with one robot.

A task registers its vector env as Gymnasium's ``vector_entry_point`` and a two-line subclass
of :class:`SingleEnv` as its ``entry_point`` (``gymnasium.make``: ``raylab eval``'s video, a
user's own loop).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import gymnasium as gym
import mujoco
import numpy as np

from raylab.envs.tasks import VECTOR_ONLY_OPTIONS


class SingleEnv(gym.Env):
    """A task's vector env with one robot, as a ``gymnasium.Env``; subclasses set
    :attr:`vec_cls`.

    Same task code, so ``reset(seed=s)`` equals env 0 of the vector env reset with seed ``s``.
    ``info``: the vector env's full-mode info of env 0 (``reward_terms`` as weight x raw). After
    an episode ends, ``step`` raises until ``reset``. The vector-only options are accepted and
    ignored, so one env_config serves both.
    """

    vec_cls: type
    metadata = {"render_modes": [], "render_fps": 50}

    def __init__(self, render_mode: Optional[str] = None, **options):
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; valid choices: None")
        opts = {k: v for k, v in options.items() if k not in VECTOR_ONLY_OPTIONS}
        self.vec = self.vec_cls(num_envs=1, info_mode="full", **opts)
        self.opts = self.vec.opts
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space
        self._done = True

    @property
    def model(self) -> mujoco.MjModel:
        return self.vec.sim.models[0]

    @property
    def data(self) -> mujoco.MjData:
        return self.vec.sim.datas[0]

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        obs, info = self.vec.reset(seed=seed)
        self._done = False
        return obs[0], self._one(info)

    def step(self, action):
        if self._done:
            raise RuntimeError("the episode has ended (or was never started); call reset()")
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (self.vec.num_actions,):
            raise ValueError(f"action must have shape ({self.vec.num_actions},), got {a.shape}")
        obs, reward, terminated, truncated, info = self.vec.step(a[None])
        self._done = bool(terminated[0] or truncated[0])
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), self._one(info)

    @staticmethod
    def _one(info: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for k, v in info.items():
            if k == "log":
                continue
            if k == "reward_terms":
                out[k] = {name: float(x[0]) for name, x in v.items()}
            elif isinstance(v, np.ndarray) and v.ndim == 1:
                out[k] = v[0].item()
            elif isinstance(v, np.ndarray):
                out[k] = v[0].copy()
        return out

    def close(self):
        self.vec.close()
