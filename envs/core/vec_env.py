"""``BatchedVecEnv``: the Gymnasium vector env under every raylab task.

A task subclasses it and supplies its physics model, its term tables and three hooks; the base
owns what every batched task does the same way:

- construction: the physics backend (:class:`~raylab.envs.core.backend.BatchedMujoco`), the
  ``autoreset_mode`` ("next_step" | "same_step") and ``info_mode`` ("none" | "full") checks,
  the spaces, one random generator per env;
- ``reset(seed=s)``: env i seeded ``s + i`` (a sequence gives one seed per env);
- ``step``: the action check (finite, clipped to [-1, 1], clips counted), NEXT_STEP autoreset
  (envs whose episode ended on the previous call reset now and ignore this call's action:
  reward 0, not done) and SAME_STEP autoreset (the final observation and info go into
  ``info`` the Gymnasium way, the env resets at once and returns its first observation);
- ``pop_log``: ``reward/<term>`` means and ``Episode_Termination/<term>`` counts since the last
  pop.

The task hands its term tables to ``_init_managers`` (policy observation terms, the
critic-only privileged terms appended after them, rewards, terminations, commands, events),
which builds the managers and the spaces. Hooks; a task must write the first three, the rest
have defaults that run the tables (docs/envs.md, "Adding a task"):

- ``_configure(options)``: the options, the robot, the physics model;
- ``_build()``: the task's state arrays and its term tables;
- ``_apply_actions(actions, ids)``: the stepping envs' actions and servo targets; the base then
  applies the step events (pushes) and steps the physics;
- ``_reset_envs(env_ids)``: events, commands and sensors of the given envs;
- ``_read_sensors()``: the state arrays read from the sensors;
- ``_observe(env_ids)``: per-observation work such as sensor noise (default none);
- ``_reset_info()``: the full-mode info of a reset;
- ``_after_physics(active, resetting)``: everything after the physics (sensors, observation,
  rewards, terminations, info), returning observation, reward, terminated, truncated, info.

``pop_step_times()`` hands out how long each part of every ``step`` took.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from raylab.envs.core.backend import BatchedMujoco
from raylab.envs.core.managers import (
    CommandManager,
    EventManager,
    ObservationManager,
    RewardManager,
    TerminationManager,
)

AUTORESET_MODES = ("next_step", "same_step")
INFO_MODES = ("none", "full")


def check_choice(name: str, value: Any, choices: Tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")
    return value


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


# Every model field domain randomisation writes (the tasks restore them exactly).
NOMINAL_FIELDS = (
    "actuator_gainprm",
    "actuator_biasprm",
    "actuator_forcerange",
    "dof_damping",
    "dof_frictionloss",
    "dof_armature",
    "body_mass",
    "body_inertia",
    "geom_friction",
)


def nominal_physics(model: mujoco.MjModel) -> Dict[str, np.ndarray]:
    """Copies of every model field domain randomisation writes."""
    return {name: getattr(model, name).copy() for name in NOMINAL_FIELDS}


class BatchedVecEnv(VectorEnv, abc.ABC):
    """N envs of one task in one process, physics on T threads (see the module docstring)."""

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    STEP_PARTS = ("action_validate", "apply_action", "backend_step", "update_state", "reset_done")

    num_actions: int
    observations: ObservationManager
    rewards: RewardManager
    terminations: TerminationManager
    commands: CommandManager
    events: EventManager

    def __init__(
        self,
        num_envs: int,
        num_threads: int = 1,
        allow_overcommit: bool = False,
        autoreset_mode: str = "next_step",
        info_mode: str = "none",
        debug_leak_kb_per_step: int = 0,
        debug_fail_backend_after_steps: int = 0,
        **options,
    ):
        model, nsubsteps = self._configure(options)
        if int(debug_leak_kb_per_step) < 0:
            raise ValueError(f"debug_leak_kb_per_step={debug_leak_kb_per_step} must be >= 0")
        self._leak_bytes = int(debug_leak_kb_per_step) * 1024
        self._leaked: List[bytes] = []  # debug_leak_kb_per_step: kept for good, on purpose
        self.autoreset = check_choice("autoreset_mode", autoreset_mode, AUTORESET_MODES)
        self.info_mode = check_choice("info_mode", info_mode, INFO_MODES)
        self.metadata = dict(self.metadata)
        self.metadata["autoreset_mode"] = (
            AutoresetMode.NEXT_STEP if self.autoreset == "next_step" else AutoresetMode.SAME_STEP
        )
        n = int(num_envs)
        self.num_envs = n
        self.sim = BatchedMujoco(
            model,
            n,
            num_threads,
            nsubsteps=nsubsteps,
            allow_overcommit=allow_overcommit,
            # pushes set the trunk's horizontal velocity (the free joint's first two dofs)
            kick_dofs=slice(self.robot.root_dof, self.robot.root_dof + 2),
            debug_fail_after_steps=debug_fail_backend_after_steps,
        )
        self.num_threads = self.sim.num_threads
        self.nominal = nominal_physics(self.sim.prototype)
        self.step_count = np.zeros(n, dtype=np.int64)
        self.ctrl = np.zeros((n, self.sim.prototype.nu))
        self.stepping = np.zeros(n, dtype=bool)  # envs that step physics this call
        self.kick_mask = np.zeros(n, dtype=bool)  # envs pushed this call (events set them)
        self.kick = np.zeros((n, 2))
        self.rngs: List[np.random.Generator] = [np.random.default_rng() for _ in range(n)]
        self._needs_reset = np.zeros(n, dtype=bool)
        self._has_reset = False
        self.action_clip_count = 0  # action entries clipped to [-1, 1] since construction
        self._step_time_sums = np.zeros(len(self.STEP_PARTS))  # seconds, since the last pop
        self._timed_steps = 0
        self._build()

    def _init_managers(
        self,
        num_actions: int,
        observations: Sequence,
        privileged: Sequence,
        rewards: Sequence,
        terminations: Sequence,
        commands: Sequence,
        events: Sequence,
        history: int = 0,
    ) -> None:
        """The term managers and the spaces. The observation is the policy's ``observations``,
        then (``history=k``) its previous k observations, then the ``privileged`` (critic-only)
        terms; ``actor_obs_dim`` is the policy's share."""
        n = self.num_envs
        policy_dim = sum(t.size for t in observations)
        self.observations = ObservationManager(
            tuple(observations) + tuple(privileged), n, policy_dim=policy_dim, history=history
        )
        self.actor_obs_dim = policy_dim * (1 + int(history))
        self.rewards = RewardManager(rewards, n)
        self.terminations = TerminationManager(terminations, n)
        self.commands = CommandManager(commands, n)
        self.events = EventManager(events)
        self.num_actions = int(num_actions)
        obs_dim = self.observations.dim
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (self.num_actions,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)

    def _read_body_sensors(self) -> None:
        """The sensors every robot here has, as (N, k) views of the gathered sensordata: joint
        positions, velocities and forces, the trunk's gyro, its trunk-frame linear velocity and
        its height. A task's ``_read_sensors`` adds its own."""
        sd, s = self.sim.sensordata, self.robot.sensors
        self.joint_pos = sd[:, s["joint_pos"]]
        self.joint_vel = sd[:, s["joint_vel"]]
        self.joint_force = sd[:, s["joint_force"]]
        self.gyro = sd[:, s["gyro"]]
        self.lin_vel = sd[:, s["local_linvel"]]
        self.trunk_height = sd[:, s["trunk_pos"].start + 2]

    # -- hooks -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _configure(self, options: Dict[str, Any]) -> Tuple[mujoco.MjModel, int]:
        """Parse the task options (``self.opts``), set ``self.robot`` (its ``root_dof``) and
        return the physics model and the physics substeps per control step."""

    @abc.abstractmethod
    def _build(self) -> None:
        """The task's state arrays, then ``_init_managers`` with its term tables."""

    def _reset_envs(self, env_ids: np.ndarray) -> None:
        """Events, commands and sensors of the envs ``env_ids`` at the start of an episode
        (default: the reset events, then the commands, then the sensors)."""
        self.events.apply("reset", self, env_ids)
        self.commands.reset(env_ids, self.rngs)
        self._read_sensors()

    def _read_sensors(self) -> None:
        """The state arrays read from the sensors (default: :meth:`_read_body_sensors` plus
        ``gravity`` in the trunk frame and ``upright_cos`` from the ``orientation`` sensor)."""
        self._read_body_sensors()
        self.gravity = gravity_from_quat(self.sim.sensordata[:, self.robot.sensors["orientation"]])
        self.upright_cos = -self.gravity[:, 2]

    def _reset_all(self, env_ids: np.ndarray, options: Dict[str, Any]) -> None:
        """``reset()`` of every env; a task with reset options overrides this."""
        self._reset_envs(env_ids)

    def _observe(self, env_ids: np.ndarray) -> None:
        """Work done once per returned observation of ``env_ids`` (default: none)."""

    def _reset_info(self) -> Dict[str, Any]:
        """The full-mode info of a reset (default: none)."""
        return {}

    @abc.abstractmethod
    def _apply_actions(self, actions: np.ndarray, ids: np.ndarray) -> None:
        """The stepping envs' action state and servo targets (``self.ctrl``)."""

    def _after_physics(self, active: np.ndarray, resetting: np.ndarray):
        """After the physics step of the ``active`` envs: state, observation, reward,
        terminated, truncated, info. Default: commands, sensors, then the tables in order
        (observation, reward, terminations); the full-mode info holds the weighted reward terms
        and this step's log."""
        self.commands.step(active, self.rngs)
        self._read_sensors()
        self._observe(np.arange(self.num_envs))
        obs = self.observations.compute(self, fresh=np.flatnonzero(resetting)).copy()
        reward = self.rewards.compute(self, active).copy()
        terminated, truncated = self.terminations.compute(self, active)
        info = self._full_step_info(active) if self.info_mode == "full" else {}
        return obs, reward, terminated.copy(), truncated.copy(), info

    # -- Gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed=None, options: Optional[dict] = None):
        n = self.num_envs
        if seed is not None:
            self.rngs = seeded_rngs(seed, n)
        ids = np.arange(n)
        self._reset_all(ids, dict(options or {}))
        self._has_reset = True
        self._needs_reset[:] = False
        self.stepping[:] = False
        self._observe(ids)
        obs = self.observations.compute(self, fresh=ids).copy()
        info = self._reset_info() if self.info_mode == "full" else {}
        return obs, info

    def step(self, actions):
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        t0 = time.perf_counter()
        actions, clipped = check_actions(actions, self.num_envs, self.num_actions)
        self.action_clip_count += clipped
        t1 = time.perf_counter()
        # NEXT_STEP autoreset: envs whose episode ended on the previous call reset now and
        # ignore this call's action (reward 0, not done).
        resetting = self._needs_reset.copy()
        if resetting.any():
            self._reset_envs(np.flatnonzero(resetting))
        self.stepping[:] = ~resetting
        active = self.stepping
        ids = np.flatnonzero(active)
        t2 = time.perf_counter()
        self._apply_actions(actions, ids)
        self.events.apply("step", self)  # pushes -> kick_mask, kick
        t3 = time.perf_counter()
        self.sim.step(self.ctrl, active, self.kick_mask, self.kick)
        self.step_count[ids] += 1
        t4 = time.perf_counter()
        obs, reward, terminated, truncated, info = self._after_physics(active, resetting)
        t5 = time.perf_counter()
        done = terminated | truncated
        if self.autoreset == "next_step":
            self._needs_reset = done
        elif done.any():
            # SAME_STEP: keep the final observation (and info), reset now, return the first
            # observation of the new episode.
            done_ids = keep_final(obs, info, done, self.info_mode == "full")
            self._reset_envs(done_ids)
            self._observe(done_ids)
            obs[done_ids] = self.observations.compute(self, fresh=done_ids, rows=done_ids)[done_ids]
        t6 = time.perf_counter()
        if self._leak_bytes:
            self._leaked.append(b"\1" * self._leak_bytes)  # touched, so it is resident
        self._step_time_sums += (t1 - t0, t3 - t2, t4 - t3, t5 - t4, (t2 - t1) + (t6 - t5))
        # The parts' intervals of this call, for a caller's trace (STEP_PART_SPANS).
        self.last_step_marks = (t0, t1, t2, t3, t4, t5, t6)
        self._timed_steps += 1
        return obs, reward, terminated, truncated, info

    def pop_step_times(self) -> Tuple[Dict[str, float], int]:
        """The mean time (ms) of each part of ``step`` (:data:`STEP_PARTS`: the action check,
        the servo targets and events, the physics, everything computed after it - sensors,
        observation, rewards, terminations, infos - and autoresets) over the steps since the
        last pop, and their number; then clear."""
        n = self._timed_steps
        means = self._step_time_sums * (1000.0 / n) if n else np.zeros(len(self.STEP_PARTS))
        self._step_time_sums = np.zeros(len(self.STEP_PARTS))
        self._timed_steps = 0
        return {name: float(means[k]) for k, name in enumerate(self.STEP_PARTS)}, n

    def _full_step_info(self, active: np.ndarray) -> Dict[str, Any]:
        """The part of a full-mode step info every task has: the weighted reward terms and this
        step's log."""
        return {
            "reward_terms": {
                name: self.rewards.weighted[k].copy() for k, name in enumerate(self.rewards.names)
            },
            "log": {**self.rewards.step_log(active), **self.terminations.step_log()},
        }

    def pop_log(self) -> Dict[str, float]:
        """``reward/<term>`` means (over envs and env-steps since the last pop, of raw x weight)
        and ``Episode_Termination/<term>`` episode counts since the last pop; then clear them."""
        return {**self.rewards.pop_log(), **self.terminations.pop_log()}

    def close_extras(self, **kwargs):
        if hasattr(self, "sim"):  # construction may have failed before the backend existed
            self.sim.close()


__all__: Sequence[str] = (
    "AUTORESET_MODES",
    "INFO_MODES",
    "BatchedVecEnv",
    "check_actions",
    "check_choice",
    "gravity_from_quat",
    "keep_final",
    "nominal_physics",
    "seeded_rngs",
)
