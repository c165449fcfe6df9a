"""Microduck balance, batched: N envs in one process on T physics threads.

``gymnasium.make_vec("raylab/MicroduckBalance-v0", num_envs=N,
vectorization_mode="vector_entry_point", num_threads=T, **options)`` builds
:class:`MicroduckBalanceVecEnv`. Given the same :class:`~raylab.envs.microduck.EpisodeParams` and
actions, env i returns exactly the bits of the reference env
(:class:`~raylab.envs.microduck.MicroduckBalanceEnv`); the task is written here as term tables
(:mod:`raylab.envs.managers`) computed for all envs at once with NumPy, on top of the shared
physics backend (:mod:`raylab.envs.backend`).

Env state is plain arrays, one row per env (``joint_pos``, ``joint_vel``, ``action``,
``step_count``, ...); every term function below reads them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from raylab.envs.backend import BatchedMujoco
from raylab.envs.managers import (
    CommandManager,
    EventManager,
    EventTerm,
    ObservationManager,
    ObsTerm,
    RewardManager,
    RewardTerm,
    TerminationManager,
    TerminationTerm,
)
from raylab.envs.microduck import (
    AUTORESET_MODES,
    GYRO_NOISE_STD,
    HEIGHT_SIGMA,
    INFO_MODES,
    MAX_LATENCY,
    N_SUBSTEPS,
    NUM_ACTIONS,
    OBS_DIM,
    PRIVILEGED_DIM,
    QUAT_NOISE_STD,
    REWARD_WEIGHTS,
    STAND_HEIGHT,
    BalanceOptions,
    EpisodeParams,
    apply_physics_params,
    check_choice,
    check_episode_params,
    draw_episode_params,
    is_fallen,
    nominal_physics,
    prototype,
    robot_index,
)

# ---------------------------------------------------------------------------------------------
# Term functions: f(env) -> one value (or one row) per env
# ---------------------------------------------------------------------------------------------


def gravity_from_quat(quat: np.ndarray) -> np.ndarray:
    """(N, 4) quaternions (w, x, y, z), normalised here -> (N, 3) gravity in the body frame."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    norm = np.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    out = np.empty((quat.shape[0], 3))
    out[:, 0] = -(2.0 * (x * z - w * y))
    out[:, 1] = -(2.0 * (y * z + w * x))
    out[:, 2] = -(1.0 - 2.0 * (x * x + y * y))
    return out


def _mean_square(x: np.ndarray) -> np.ndarray:
    """Row mean of x*x: a C-contiguous (N, k) array reduced along its last axis (same pairwise
    summation as the reference's 1-D mean)."""
    return np.mean(np.ascontiguousarray(x * x), axis=1)


# vector-env plumbing shared with the joystick tasks (envs/joystick.py)
def seeded_rngs(seed, n: int) -> List[np.random.Generator]:
    """``reset(seed=...)``: an int s seeds env i with s + i; a sequence gives one seed per env."""
    seeds = (
        list(seed)
        if isinstance(seed, (list, tuple, np.ndarray))
        else [int(seed) + i for i in range(n)]
    )
    if len(seeds) != n:
        raise ValueError(f"reset got {len(seeds)} seeds for {n} envs")
    return [np.random.default_rng(s) for s in seeds]


def check_actions(actions, num_envs: int, num_actions: int) -> Tuple[np.ndarray, int]:
    """(num_envs, num_actions) finite actions clipped to [-1, 1], and how many entries were
    clipped; anything else raises one clear ValueError."""
    a = np.asarray(actions, dtype=np.float64)
    if a.shape != (num_envs, num_actions):
        raise ValueError(f"actions must have shape ({num_envs}, {num_actions}), got {a.shape}")
    bad = ~np.isfinite(a).all(axis=1)
    if bad.any():
        raise ValueError(
            f"actions contain NaN or Inf in env(s) {np.flatnonzero(bad).tolist()}; "
            f"actions must be finite (values outside [-1, 1] are clipped)"
        )
    clipped = np.clip(a, -1.0, 1.0)
    return clipped, int(np.count_nonzero(clipped != a))


def keep_final(
    obs: np.ndarray, info: Dict[str, Any], done: np.ndarray, full_info: bool
) -> np.ndarray:
    """SAME_STEP autoreset: the ending envs' final observation (and info, in full info mode)
    go into ``info`` the Gymnasium way; returns their ids, which the caller then resets."""
    done_ids = np.flatnonzero(done)
    final_obs = np.zeros_like(obs)
    final_obs[done_ids] = obs[done_ids]
    if full_info:
        info["final_info"] = {k: v for k, v in info.items() if k != "log"}
        info["_final_info"] = done.copy()
    info["final_obs"] = final_obs
    info["_final_obs"] = done.copy()
    return done_ids


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


# reward terms (raw values; the weights are in the tables)
def upright(env):
    return np.maximum(0.0, env.upright_cos)


def height_gaussian(env):
    e = (env.trunk_height - STAND_HEIGHT) / HEIGHT_SIGMA
    return np.exp(-0.5 * e * e)


def height_linear(env):
    return np.clip(env.trunk_height / STAND_HEIGHT, 0.0, 1.0)


def posture(env):
    return _mean_square(env.joint_pos - env.stand)


def action_rate(env):
    return _mean_square(env.action - env.prev_action)


def joint_vel_sq(env):
    return _mean_square(env.joint_vel)


def effort(env):
    return _mean_square(env.joint_force)


# termination terms
def time_out(env):
    return env.step_count >= env.episode_steps


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

_REWARD_FNS = {
    "v1": {
        "upright": upright,
        "height": height_gaussian,
        "posture": posture,
        "action_rate": action_rate,
        "joint_vel": joint_vel_sq,
        "effort": effort,
    },
    "v2": {
        "upright": upright,
        "height": height_linear,
        "action_rate": action_rate,
        "joint_vel": joint_vel_sq,
    },
}
REWARDS = {
    version: tuple(RewardTerm(name, fns[name], REWARD_WEIGHTS[version][name]) for name in fns)
    for version, fns in _REWARD_FNS.items()
}

TERMINATIONS = (TerminationTerm("time_out", time_out, time_out=True),)

EVENTS = (
    EventTerm("physics", reset_physics, mode="reset"),
    EventTerm("initial_state", reset_state, mode="reset"),
    EventTerm("push", scheduled_push, mode="step"),
)

COMMANDS = ()  # balance has no command; the joystick tasks add theirs here


# ---------------------------------------------------------------------------------------------
# The vector env
# ---------------------------------------------------------------------------------------------


class MicroduckBalanceVecEnv(VectorEnv):
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

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int,
        num_threads: int = 1,
        allow_overcommit: bool = False,
        autoreset_mode: str = "next_step",
        info_mode: str = "none",
        **options,
    ):
        self.opts = BalanceOptions.from_kwargs(**options)
        self.reward_version = self.opts.reward_version
        self.autoreset = check_choice("autoreset_mode", autoreset_mode, AUTORESET_MODES)
        self.info_mode = check_choice("info_mode", info_mode, INFO_MODES)
        self.metadata = dict(self.metadata)
        self.metadata["autoreset_mode"] = (
            AutoresetMode.NEXT_STEP if self.autoreset == "next_step" else AutoresetMode.SAME_STEP
        )
        n = int(num_envs)
        self.num_envs = n
        self.robot = robot_index(self.opts.variant)
        self.sim = BatchedMujoco(
            prototype(self.opts.variant),
            n,
            num_threads,
            nsubsteps=N_SUBSTEPS,
            allow_overcommit=allow_overcommit,
            kick_dofs=slice(self.robot.root_dof, self.robot.root_dof + 2),
        )
        self.num_threads = self.sim.num_threads
        self.nominal = nominal_physics(self.sim.prototype)

        dim = OBS_DIM + (PRIVILEGED_DIM if self.opts.privileged_obs else 0)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (NUM_ACTIONS,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)

        # Env state: plain arrays, one row per env.
        self.stand = self.robot.stand
        self.lower, self.upper = self.robot.lower, self.robot.upper
        self.episode_steps = self.opts.episode_steps
        self.action_scale = self.opts.action_scale
        self.step_count = np.zeros(n, dtype=np.int64)
        self.action = np.zeros((n, NUM_ACTIONS))  # the action taken on the last step
        self.prev_action = np.zeros((n, NUM_ACTIONS))  # the one before it
        self.action_history = np.zeros((n, MAX_LATENCY + 1, NUM_ACTIONS))  # oldest first
        self.latency = np.zeros(n, dtype=np.int64)
        self.sensor_noise = np.zeros(n, dtype=bool)
        self.noise_rngs: List[Optional[np.random.Generator]] = [None] * n
        self.episode_params: List[Optional[EpisodeParams]] = [None] * n
        self.push_steps = np.full((n, 1), -1, dtype=np.int64)  # -1 pads unused slots
        self.push_vel = np.zeros((n, 1, 2))
        self.stepping = np.zeros(n, dtype=bool)  # envs that step physics this call
        self.kick_mask = np.zeros(n, dtype=bool)
        self.kick = np.zeros((n, 2))
        self.ctrl = np.zeros((n, self.sim.prototype.nu))
        self.obs_gyro = np.zeros((n, 3))
        self.obs_gravity = np.zeros((n, 3))

        self.rngs: List[np.random.Generator] = [np.random.default_rng() for _ in range(n)]
        terms = OBSERVATIONS + (PRIVILEGED_OBSERVATIONS if self.opts.privileged_obs else ())
        self.observations = ObservationManager(terms, n)
        self.actor_obs_dim = ObservationManager(OBSERVATIONS, 1).dim
        self.rewards = RewardManager(REWARDS[self.reward_version], n)
        self.terminations = TerminationManager(TERMINATIONS, n)
        self.commands = CommandManager(COMMANDS, n)
        self.events = EventManager(EVENTS)
        self._needs_reset = np.zeros(n, dtype=bool)
        self._has_reset = False
        # Survival statistics of the running episodes and of those finished since the last pop.
        self._alive_steps = np.zeros(n, dtype=np.int64)  # steps not fallen (is_fallen)
        self._height_sum = np.zeros(n)
        self._finished = {"episodes": 0, "survival": 0.0, "trunk_height": 0.0}
        self.action_clip_count = 0  # action entries clipped to [-1, 1] since construction

    # -- sensors -----------------------------------------------------------------------------

    def _read_sensors(self) -> None:
        """Views of the gathered sensordata as named (N, k) state arrays."""
        sd, s = self.sim.sensordata, self.robot.sensors
        self.joint_pos = sd[:, s["joint_pos"]]
        self.joint_vel = sd[:, s["joint_vel"]]
        self.joint_force = sd[:, s["joint_force"]]
        self.gyro = sd[:, s["gyro"]]
        self.quat = sd[:, s["orientation"]]
        self.trunk_height = sd[:, s["trunk_pos"].start + 2]
        self.lin_vel = sd[:, s["local_linvel"]]
        self.upright_cos = -gravity_from_quat(self.quat)[:, 2]

    def _observe_sensors(self, env_ids: np.ndarray) -> None:
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
        n = self.num_envs
        if seed is not None:
            self.rngs = seeded_rngs(seed, n)
        replay = (options or {}).get("episode_params")
        if replay is not None and len(replay) != n:
            raise ValueError(f"episode_params has {len(replay)} entries for {n} envs")
        ids = np.arange(n)
        self._reset_envs(ids, replay)
        self._has_reset = True
        self._alive_steps[:] = 0  # episodes cut short by this reset are not counted
        self._height_sum[:] = 0.0
        self._needs_reset[:] = False
        self.stepping[:] = False
        self._observe_sensors(ids)
        obs = self.observations.compute(self).copy()
        info: Dict[str, Any] = {}
        if self.info_mode == "full":
            info = self._state_info(np.zeros(n, dtype=bool))
            info["episode_params"] = self._params_array()
        return obs, info

    def _reset_envs(self, env_ids: np.ndarray, replay: Optional[Sequence] = None) -> None:
        for k, i in enumerate(env_ids):
            p = None if replay is None else replay[k]
            if p is None:
                p = draw_episode_params(self.rngs[i], self.opts, self.robot)
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

    def step(self, actions):
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        actions, clipped = check_actions(actions, self.num_envs, NUM_ACTIONS)
        self.action_clip_count += clipped
        n = self.num_envs

        # NEXT_STEP autoreset: envs whose episode ended on the previous call reset now and
        # ignore this call's action (reward 0, not done).
        resetting = self._needs_reset.copy()
        reset_ids = np.flatnonzero(resetting)
        if reset_ids.size:
            self._reset_envs(reset_ids)
        self.stepping[:] = ~resetting
        active = self.stepping
        act_ids = np.flatnonzero(active)

        # Actions, latency and servo targets of the stepping envs.
        self.prev_action[act_ids] = self.action[act_ids]
        self.action[act_ids] = actions[act_ids]
        hist = self.action_history
        hist[act_ids, :-1] = hist[act_ids, 1:]
        hist[act_ids, -1] = actions[act_ids]
        delayed = hist[np.arange(n), MAX_LATENCY - self.latency]
        target = np.clip(self.stand + self.action_scale * delayed, self.lower, self.upper)
        self.ctrl[:, self.robot.act_ids] = target

        self.events.apply("step", self)  # pushes -> kick_mask, kick
        self.sim.step(self.ctrl, active, self.kick_mask, self.kick)
        self.step_count[act_ids] += 1
        self.commands.step(active, self.rngs)

        self._read_sensors()
        self._observe_sensors(np.arange(n))
        obs = self.observations.compute(self).copy()
        reward = self.rewards.compute(self, active).copy()
        terminated, truncated = self.terminations.compute(self, active)
        terminated, truncated = terminated.copy(), truncated.copy()
        done = terminated | truncated
        self._track_episodes(active, done)

        info: Dict[str, Any] = {}
        if self.info_mode == "full":
            info = self._state_info(self.kick_mask)
            info["reward_terms"] = {
                name: self.rewards.weighted[k].copy() for k, name in enumerate(self.rewards.names)
            }
            if reset_ids.size:
                info["episode_params"] = self._params_array()
                info["_episode_params"] = resetting.copy()
            info["log"] = {**self.rewards.step_log(active), **self.terminations.step_log()}

        if self.autoreset == "next_step":
            self._needs_reset = done
        elif done.any():
            # SAME_STEP: keep the final observation (and info), reset now, return the first
            # observation of the new episode.
            done_ids = keep_final(obs, info, done, self.info_mode == "full")
            self._reset_envs(done_ids)
            self._observe_sensors(done_ids)
            obs[done_ids] = self.observations.compute(self)[done_ids]
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
        of steps not fallen, :func:`~raylab.envs.microduck.is_fallen`) and mean trunk height (m);
        then clear them."""
        f = self._finished
        n = f["episodes"]
        out = {"episodes": n}
        if n:
            out["survival"] = f["survival"] / n
            out["trunk_height"] = f["trunk_height"] / n
        self._finished = {"episodes": 0, "survival": 0.0, "trunk_height": 0.0}
        return out

    def pop_log(self) -> Dict[str, float]:
        """``reward/<term>`` means (over envs and env-steps since the last pop, of raw x weight)
        and ``Episode_Termination/<term>`` episode counts since the last pop; then clear them."""
        return {**self.rewards.pop_log(), **self.terminations.pop_log()}

    def close_extras(self, **kwargs):
        if hasattr(self, "sim"):  # construction may have failed before the backend existed
            self.sim.close()
