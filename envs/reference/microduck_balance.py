"""The reference env of microduck_balance: the task's specification, one robot, plain NumPy.

``gymnasium.make("raylab/MicroduckBalance-v0")`` builds :class:`MicroduckBalanceEnv`. It is
written for clarity (one ``MjData``, one step at a time) and is the oracle of the equality
contract (:mod:`raylab.envs.contract`): the batched env of the task module
(:mod:`raylab.envs.tasks.microduck_balance`) must return its bits given the same episode
parameters and actions. What the two share, written once: the robot
(:mod:`raylab.envs.robots.microduck`), the options and their checks, the episode draw, the
pushes' schedule, and the reward terms with their weights (the task's reward table, called here
on this robot's state as a one-row array). What is written twice and compared: reset and step,
latency, pushes, sensor noise, the observation and the state every term reads.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any, Dict, Optional

import gymnasium as gym
import mujoco
import numpy as np

from raylab.envs.core.vec_env import nominal_physics
from raylab.envs.robots.microduck import (
    N_SUBSTEPS,
    NUM_ACTIONS,
    apply_physics_params,
    is_fallen,
    load_model,
    projected_gravity,
    robot_index,
)
from raylab.envs.tasks.microduck_balance import (
    GYRO_NOISE_STD,
    OBS_DIM,
    OBS_SCALE,
    PRIVILEGED_DIM,
    QUAT_NOISE_STD,
    EpisodeParams,
    balance_options,
    check_episode_params,
    draw_episode_params,
    push_scale,
    rewards,
)


class MicroduckBalanceEnv(gym.Env):
    """One Microduck that must keep standing under pushes (the reference implementation).

    Options are the fields of :class:`MicroduckBalanceConfig`; the vector-only
    ones (num_threads, autoreset_mode, allow_overcommit, info_mode) are accepted and ignored.
    Seeding: ``reset(seed=s)`` seeds ``self.np_random`` with ``s`` (Gymnasium's rule), so env i of
    the batched env reset with seed ``s`` equals this env reset with seed ``s + i``.
    """

    metadata = {"render_modes": [], "render_fps": 50}

    def __init__(self, render_mode: Optional[str] = None, **options):
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; valid choices: None")
        self.opts = balance_options(options)
        self.rewards = rewards(self.opts)
        self.model = load_model(self.opts.variant)
        self.data = mujoco.MjData(self.model)
        self.robot = robot_index(self.opts.variant)
        self.nominal = nominal_physics(self.model)
        self.actor_obs_dim = OBS_DIM * (1 + self.opts.obs_history)
        dim = self.actor_obs_dim + (PRIVILEGED_DIM if self.opts.privileged_obs else 0)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (NUM_ACTIONS,), np.float32)
        self.action_clip_count = 0  # action entries clipped to [-1, 1] since construction
        self.params: Optional[EpisodeParams] = None
        self.t = 0
        self.ended = False
        self.env_steps = 0  # this env's steps so far, for a training push curriculum

    # -- reset -----------------------------------------------------------------------------

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        replay = (options or {}).get("episode_params")
        if replay is None:
            factor = push_scale(self.opts, self.env_steps)
            params = draw_episode_params(self.np_random, self.opts, self.robot, factor)
        else:
            params = check_episode_params(replay, self.robot, self.opts.episode_steps)
        self.params = params
        self.ended = False

        apply_physics_params(self.model, self.nominal, self.robot, params.domain)
        mujoco.mj_resetDataKeyframe(self.model, self.data, self.robot.key_id)
        self.data.qpos[:] = params.qpos
        self.data.qvel[:] = params.qvel
        self.data.ctrl[self.robot.act_ids] = self.robot.stand
        mujoco.mj_forward(self.model, self.data)

        self.t = 0
        zeros = np.zeros(NUM_ACTIONS)
        self.last_action = zeros
        self.action_queue = collections.deque(
            [zeros] * (params.latency + 1), maxlen=params.latency + 1
        )
        self.noise_rng = np.random.default_rng(params.noise_seed)
        self.obs_history = None  # filled with the first observation
        obs = self._observe(zeros)
        info = {"episode_params": params.copy(), **self._state_info()}
        return obs, info

    # -- step ------------------------------------------------------------------------------

    def step(self, action):
        if self.params is None:
            raise RuntimeError("call reset() before step()")
        if self.ended:
            raise RuntimeError("the episode has ended; call reset()")
        action = self._check_action(action)

        # The servos get the action from `latency` steps ago.
        self.action_queue.append(action)
        delayed = self.action_queue[0]
        target = np.clip(
            self.robot.stand + self.opts.action_scale * delayed, self.robot.lower, self.robot.upper
        )
        self.data.ctrl[self.robot.act_ids] = target

        # A push adds (vx, vy) to the trunk's linear velocity before this step's physics.
        hits = np.flatnonzero(self.params.push_steps == self.t)
        pushed = hits.size > 0
        if pushed:
            dof = self.robot.root_dof
            self.data.qvel[dof : dof + 2] += self.params.push_vel[hits[0]]

        mujoco.mj_step(self.model, self.data, N_SUBSTEPS)
        mujoco.mj_forward(self.model, self.data)  # every observation channel on one timestamp
        self.t += 1
        self.env_steps += 1

        reward, terms = self._reward(action, self.last_action)
        self.last_action = action
        obs = self._observe(action)
        state = self._state_info()
        terminated = bool(self.opts.fall_termination and state["fallen"])
        truncated = self.t >= self.opts.episode_steps
        self.ended = terminated or truncated
        info = {"reward_terms": terms, "pushed": pushed, **state}
        return obs, reward, terminated, truncated, info

    def _check_action(self, action) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (NUM_ACTIONS,):
            raise ValueError(f"action must have shape ({NUM_ACTIONS},), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"action contains NaN or Inf: {a.tolist()}; actions must be finite")
        clipped = np.clip(a, -1.0, 1.0)
        self.action_clip_count += int(np.count_nonzero(clipped != a))
        return clipped

    # -- observation and reward ------------------------------------------------------------

    def _observe(self, action: np.ndarray) -> np.ndarray:
        q = self.data.qpos[self.robot.qpos_adr]
        qd = self.data.qvel[self.robot.dof_adr]
        gyro = self.data.sensor("gyro").data.copy()
        quat = self.data.sensor("orientation").data.copy()
        if self.params.sensor_noise:
            n = self.noise_rng.standard_normal(7)
            gyro = gyro + GYRO_NOISE_STD * n[:3]
            quat = quat + QUAT_NOISE_STD * n[3:]
        gravity = np.array(projected_gravity(quat))
        raw = np.concatenate([q - self.robot.stand, qd, action, gyro, gravity])
        obs = (raw * OBS_SCALE).astype(np.float32)
        k = self.opts.obs_history
        if k:  # the previous k observations, newest first (the first one k times at a reset)
            if self.obs_history is None:
                self.obs_history = collections.deque([obs] * k, maxlen=k)
            past = list(self.obs_history)
            self.obs_history.appendleft(obs)
            obs = np.concatenate([obs, *past])
        if not self.opts.privileged_obs:
            return obs
        extra = np.concatenate(
            [self.data.sensor("local_linvel").data, self.data.sensor("trunk_pos").data[2:3]]
        )
        return np.concatenate([obs, extra.astype(np.float32)])

    def _trunk_height(self) -> float:
        return float(self.data.xpos[self.robot.trunk_id, 2])

    def _upright_cos(self) -> float:
        """Cosine of the trunk's tilt: z of its up axis, from the true orientation sensor."""
        return -projected_gravity(self.data.sensor("orientation").data)[2]

    def _reward(self, action: np.ndarray, prev_action: np.ndarray):
        """The task's reward table (the same term functions as the batched env) on this
        robot's state, one row; the weighted terms added in table order."""
        state = SimpleNamespace(
            upright_cos=np.array([self._upright_cos()]),
            trunk_height=np.array([self._trunk_height()]),
            joint_pos=self.data.qpos[self.robot.qpos_adr][None, :],
            joint_vel=self.data.qvel[self.robot.dof_adr][None, :],
            joint_force=self.data.actuator_force[self.robot.act_ids][None, :],
            stand=self.robot.stand,
            action=action[None, :],
            prev_action=prev_action[None, :],
        )
        reward = 0.0
        terms = {}
        for term in self.rewards:
            terms[term.name] = float(term.weight * term.fn(state)[0])
            reward += terms[term.name]
        return reward, terms

    def _state_info(self) -> Dict[str, Any]:
        h, up = self._trunk_height(), self._upright_cos()
        return {
            "trunk_height": h,
            "upright_cos": up,
            "fallen": bool(is_fallen(h, up)),
            "step": self.t,
        }
