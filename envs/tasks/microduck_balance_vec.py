"""Microduck balance, batched: N envs in one process on T physics threads.

``gymnasium.make_vec("raylab/MicroduckBalance-v0", num_envs=N,
vectorization_mode="vector_entry_point", num_threads=T, **options)`` builds
:class:`MicroduckBalanceVecEnv`. Given the same
:class:`~raylab.envs.tasks.microduck_balance.EpisodeParams` and actions, env i returns exactly the
bits of the reference env (:class:`~raylab.envs.tasks.microduck_balance.MicroduckBalanceEnv`); the
task is written as term tables (:mod:`raylab.envs.core.managers`) computed for all envs at once
with NumPy, on top of the shared physics backend (:mod:`raylab.envs.core.backend`): the reward
terms with their weights in :data:`raylab.envs.tasks.microduck_balance.REWARDS`, the observation,
termination and event terms here.

Env state is plain arrays, one row per env (``joint_pos``, ``joint_vel``, ``action``,
``step_count``, ...); every term function below reads them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from raylab.envs.core.managers import EventTerm, ObsTerm, TerminationTerm
from raylab.envs.core.vec_env import BatchedVecEnv, gravity_from_quat
from raylab.envs.tasks.microduck_balance import (
    GYRO_NOISE_STD,
    MAX_LATENCY,
    N_SUBSTEPS,
    NUM_ACTIONS,
    QUAT_NOISE_STD,
    REWARDS,
    EpisodeParams,
    apply_physics_params,
    balance_options,
    check_episode_params,
    draw_episode_params,
    is_fallen,
    prototype,
    push_scale,
    robot_index,
)

# ---------------------------------------------------------------------------------------------
# Term functions: f(env) -> one value (or one row) per env
# ---------------------------------------------------------------------------------------------


# observation terms
def obs_joint_pos(env):
    return env.joint_pos - env.stand


def obs_joint_vel(env):
    return env.joint_vel


def obs_action(env):
    return env.action


def obs_gyro(env):
    return env.obs_gyro


def obs_gravity(env):
    return env.obs_gravity


# termination terms
def time_out(env):
    return env.step_count >= env.episode_steps


def fallen(env):
    """Training only (``fall_termination``): the duck is down."""
    return is_fallen(env.trunk_height, env.upright_cos)


# event terms
def reset_physics(env, env_ids):
    """Restore each model's nominal physics, then write the episode's domain randomisation."""
    for i in env_ids:
        apply_physics_params(
            env.sim.models[i], env.nominal, env.robot, env.episode_params[i].domain
        )


def reset_state(env, env_ids):
    """Keyframe, the episode's initial state, one mj_forward; clear the action history."""
    ctrl = np.zeros(env.sim.prototype.nu)
    ctrl[env.robot.act_ids] = env.stand
    for i in env_ids:
        p = env.episode_params[i]
        env.sim.reset_env(i, env.robot.key_id, p.qpos, p.qvel, ctrl)
    env.step_count[env_ids] = 0
    env.action[env_ids] = 0.0
    env.prev_action[env_ids] = 0.0
    env.action_history[env_ids] = 0.0


def scheduled_push(env, env_ids=None):
    """Pushes drawn for the episode: add (vx, vy) to the trunk on the scheduled control step."""
    hit = (env.push_steps == env.step_count[:, None]) & env.stepping[:, None]
    env.kick_mask[:] = hit.any(axis=1)
    env.kick[:] = env.push_vel[np.arange(env.num_envs), hit.argmax(axis=1)]


# ---------------------------------------------------------------------------------------------
# The task as tables
# ---------------------------------------------------------------------------------------------

OBSERVATIONS = (
    ObsTerm("joint_pos", obs_joint_pos, NUM_ACTIONS, scale=1.0),
    ObsTerm("joint_vel", obs_joint_vel, NUM_ACTIONS, scale=0.05),
    ObsTerm("last_action", obs_action, NUM_ACTIONS, scale=1.0),
    ObsTerm("gyro", obs_gyro, 3, scale=0.25),
    ObsTerm("projected_gravity", obs_gravity, 3, scale=1.0),
)


def obs_base_lin_vel(env):
    return env.lin_vel


def obs_base_height(env):
    return env.trunk_height[:, None]


# privileged_obs: critic-only entries after the policy's observation (microduck.PRIVILEGED_DIM).
PRIVILEGED_OBSERVATIONS = (
    ObsTerm("base_lin_vel", obs_base_lin_vel, 3),
    ObsTerm("base_height", obs_base_height, 1),
)

TERMINATIONS = (TerminationTerm("time_out", time_out, time_out=True),)
FALL_TERMINATION = TerminationTerm("fallen", fallen)  # with fall_termination (training only)

EVENTS = (
    EventTerm("physics", reset_physics, mode="reset"),
    EventTerm("initial_state", reset_state, mode="reset"),
    EventTerm("push", scheduled_push, mode="step"),
)

COMMANDS = ()  # balance has no command; the joystick tasks add theirs here


# ---------------------------------------------------------------------------------------------
# The vector env
# ---------------------------------------------------------------------------------------------


class MicroduckBalanceVecEnv(BatchedVecEnv):
    """N Microducks stepped on T threads; a ``gymnasium.vector.VectorEnv``.

    Options: the fields of ``MicroduckBalanceConfig`` plus ``num_threads``, ``allow_overcommit``,
    ``autoreset_mode`` ("next_step" | "same_step") and ``info_mode``:

    - ``"none"`` (default): ``infos`` is ``{}`` (in same_step mode it carries only ``final_obs``
      and ``_final_obs`` on steps where an episode ended); safe under RLlib's DictInfoToList.
    - ``"full"``: per-env arrays (``trunk_height``, ``upright_cos``, ``fallen``, ``pushed``,
      ``step``, ``reward_terms`` dict), ``episode_params`` (object array) on reset, and
      ``infos["log"]``: this step's ``reward/<term>`` means and ``Episode_Termination/<term>``
      counts (plain floats/ints, so not DictInfoToList-compatible).

    Logging statistics accumulate in both modes; :meth:`pop_log` returns and clears them.
    """

    def _configure(self, options):
        self.opts = balance_options(options)
        self.reward_version = self.opts.reward_version
        self.robot = robot_index(self.opts.variant)
        return prototype(self.opts.variant), N_SUBSTEPS

    def _build(self) -> None:
        n = self.num_envs
        self._init_managers(
            NUM_ACTIONS,
            OBSERVATIONS,
            PRIVILEGED_OBSERVATIONS if self.opts.privileged_obs else (),
            REWARDS[self.reward_version],
            TERMINATIONS + ((FALL_TERMINATION,) if self.opts.fall_termination else ()),
            COMMANDS,
            EVENTS,
            history=self.opts.obs_history,
        )

        # Env state: plain arrays, one row per env.
        self.stand = self.robot.stand
        self.lower, self.upper = self.robot.lower, self.robot.upper
        self.episode_steps = self.opts.episode_steps
        self.action_scale = self.opts.action_scale
        self.action = np.zeros((n, NUM_ACTIONS))  # the action taken on the last step
        self.prev_action = np.zeros((n, NUM_ACTIONS))  # the one before it
        self.action_history = np.zeros((n, MAX_LATENCY + 1, NUM_ACTIONS))  # oldest first
        self.latency = np.zeros(n, dtype=np.int64)
        self.sensor_noise = np.zeros(n, dtype=bool)
        self.noise_rngs: List[Optional[np.random.Generator]] = [None] * n
        self.episode_params: List[Optional[EpisodeParams]] = [None] * n
        self.push_steps = np.full((n, 1), -1, dtype=np.int64)  # -1 pads unused slots
        self.push_vel = np.zeros((n, 1, 2))
        self.obs_gyro = np.zeros((n, 3))
        self.obs_gravity = np.zeros((n, 3))
        self.env_steps = 0  # steps of all envs so far, for a training push curriculum

        # Survival statistics of the running episodes and of those finished since the last pop.
        self._alive_steps = np.zeros(n, dtype=np.int64)  # steps not fallen (is_fallen)
        self._height_sum = np.zeros(n)
        self._finished = {"episodes": 0, "survival": 0.0, "trunk_height": 0.0}

    # -- sensors -----------------------------------------------------------------------------

    def _read_sensors(self) -> None:
        """Views of the gathered sensordata as named (N, k) state arrays."""
        self._read_body_sensors()
        self.quat = self.sim.sensordata[:, self.robot.sensors["orientation"]]
        self.upright_cos = -gravity_from_quat(self.quat)[:, 2]

    def _observe(self, env_ids: np.ndarray) -> None:
        """The observed gyro and gravity of ``env_ids``: one sensor-noise draw per env and
        returned observation, from that episode's own noise stream."""
        if env_ids.size == 0:
            return
        gyro = self.gyro[env_ids]
        quat = self.quat[env_ids]
        noisy = self.sensor_noise[env_ids]
        if noisy.any():
            draws = np.zeros((env_ids.size, 7))
            for row in np.flatnonzero(noisy):
                draws[row] = self.noise_rngs[env_ids[row]].standard_normal(7)
            gyro[noisy] = gyro[noisy] + GYRO_NOISE_STD * draws[noisy, :3]
            quat[noisy] = quat[noisy] + QUAT_NOISE_STD * draws[noisy, 3:]
        self.obs_gyro[env_ids] = gyro
        self.obs_gravity[env_ids] = gravity_from_quat(quat)

    # -- reset -------------------------------------------------------------------------------

    def reset(self, *, seed=None, options: Optional[dict] = None):
        """Reset every env. ``seed=s`` seeds env i with ``s + i`` (a list gives one seed per env);
        ``options={"episode_params": [p_0, ..., p_N-1]}`` replays drawn values (None entries
        draw)."""
        replay = (options or {}).get("episode_params")
        if replay is not None and len(replay) != self.num_envs:
            raise ValueError(f"episode_params has {len(replay)} entries for {self.num_envs} envs")
        return super().reset(seed=seed, options=options)

    def _reset_all(self, env_ids: np.ndarray, options: Dict[str, Any]) -> None:
        self._reset_envs(env_ids, options.get("episode_params"))
        self._alive_steps[:] = 0  # episodes cut short by this reset are not counted
        self._height_sum[:] = 0.0

    def _reset_info(self) -> Dict[str, Any]:
        info = self._state_info(np.zeros(self.num_envs, dtype=bool))
        info["episode_params"] = self._params_array()
        return info

    def _reset_envs(self, env_ids: np.ndarray, replay: Optional[Sequence] = None) -> None:
        factor = push_scale(self.opts, self.env_steps)
        for k, i in enumerate(env_ids):
            p = None if replay is None else replay[k]
            if p is None:
                p = draw_episode_params(self.rngs[i], self.opts, self.robot, factor)
            else:
                p = check_episode_params(p, self.robot, self.episode_steps)
            self.episode_params[i] = p
            self.latency[i] = p.latency
            self.sensor_noise[i] = p.sensor_noise
            self.noise_rngs[i] = np.random.default_rng(p.noise_seed)
        self._load_push_schedules(env_ids)
        self.events.apply("reset", self, env_ids)
        self.commands.reset(env_ids, self.rngs)
        self._read_sensors()

    def _load_push_schedules(self, env_ids: np.ndarray) -> None:
        width = max(len(self.episode_params[i].push_steps) for i in env_ids)
        if width > self.push_steps.shape[1]:
            grow = width - self.push_steps.shape[1]
            self.push_steps = np.pad(self.push_steps, ((0, 0), (0, grow)), constant_values=-1)
            self.push_vel = np.pad(self.push_vel, ((0, 0), (0, grow), (0, 0)))
        for i in env_ids:
            p = self.episode_params[i]
            k = len(p.push_steps)
            self.push_steps[i] = -1
            self.push_vel[i] = 0.0
            self.push_steps[i, :k] = p.push_steps
            self.push_vel[i, :k] = p.push_vel

    def _params_array(self) -> np.ndarray:
        out = np.empty(self.num_envs, dtype=object)
        for i, p in enumerate(self.episode_params):
            out[i] = p.copy()
        return out

    # -- step --------------------------------------------------------------------------------

    def _apply_actions(self, actions: np.ndarray, act_ids: np.ndarray) -> None:
        # Actions, latency and servo targets of the stepping envs.
        n = self.num_envs
        self.prev_action[act_ids] = self.action[act_ids]
        self.action[act_ids] = actions[act_ids]
        hist = self.action_history
        hist[act_ids, :-1] = hist[act_ids, 1:]
        hist[act_ids, -1] = actions[act_ids]
        delayed = hist[np.arange(n), MAX_LATENCY - self.latency]
        target = np.clip(self.stand + self.action_scale * delayed, self.lower, self.upper)
        self.ctrl[:, self.robot.act_ids] = target

    def _after_physics(self, active: np.ndarray, resetting: np.ndarray):
        n = self.num_envs
        self.env_steps += int(active.sum())
        reset_ids = np.flatnonzero(resetting)
        self.commands.step(active, self.rngs)

        self._read_sensors()
        self._observe(np.arange(n))
        obs = self.observations.compute(self, fresh=reset_ids).copy()
        reward = self.rewards.compute(self, active).copy()
        terminated, truncated = self.terminations.compute(self, active)
        terminated, truncated = terminated.copy(), truncated.copy()
        done = terminated | truncated
        self._track_episodes(active, done)

        info: Dict[str, Any] = {}
        if self.info_mode == "full":
            info = self._state_info(self.kick_mask)
            full = self._full_step_info(active)
            info["reward_terms"] = full["reward_terms"]
            if reset_ids.size:
                info["episode_params"] = self._params_array()
                info["_episode_params"] = resetting.copy()
            info["log"] = full["log"]
        return obs, reward, terminated, truncated, info

    def _state_info(self, pushed: np.ndarray) -> Dict[str, np.ndarray]:
        return {
            "trunk_height": self.trunk_height.copy(),
            "upright_cos": self.upright_cos.copy(),
            "fallen": is_fallen(self.trunk_height, self.upright_cos),
            "pushed": pushed.copy(),
            "step": self.step_count.copy(),
        }

    # -- logging -----------------------------------------------------------------------------

    def _track_episodes(self, active: np.ndarray, done: np.ndarray) -> None:
        self._alive_steps += active & ~is_fallen(self.trunk_height, self.upright_cos)
        self._height_sum += np.where(active, self.trunk_height, 0.0)
        if done.any():
            steps = self.step_count[done]
            self._finished["episodes"] += int(done.sum())
            self._finished["survival"] += float(np.sum(self._alive_steps[done] / steps))
            self._finished["trunk_height"] += float(np.sum(self._height_sum[done] / steps))
            self._alive_steps[done] = 0
            self._height_sum[done] = 0.0

    def pop_episode_stats(self) -> Dict[str, float]:
        """Over the episodes finished since the last call: their number, mean survival (fraction
        of steps not fallen, :func:`~raylab.envs.tasks.microduck_balance.is_fallen`) and mean trunk
        height (m); then clear them."""
        f = self._finished
        n = f["episodes"]
        out = {"episodes": n}
        if n:
            out["survival"] = f["survival"] / n
            out["trunk_height"] = f["trunk_height"] / n
        self._finished = {"episodes": 0, "survival": 0.0, "trunk_height": 0.0}
        return out
