"""Joystick (velocity-command tracking) tasks on the batched MuJoCo backend: the shared pieces.

A joystick task is a :class:`JoystickTask` table (robot model and names, observation terms, gait and
contact constants, domain-randomisation ranges) plus the options of its config dataclass in
:mod:`raylab.envs.tasks`. :class:`JoystickVecEnv` runs any such table on
:class:`~raylab.envs.core.vec_env.BatchedVecEnv` with the term managers of
:mod:`raylab.envs.core.managers`; :class:`JoystickEnv` is the same env with one robot behind the
plain ``gymnasium.Env`` interface (``gymnasium.make``, ``raylab eval``). The two tasks are
``raylab.envs.tasks.go2`` (Go2-like quadruped on flat ground) and
``raylab.envs.tasks.microduck_joystick``.

Reward terms are shared by both tasks. Each is one function ``f(env) -> (N,)`` of the plain
state arrays below, listed in :data:`REWARD_TERMS`; its weight is the option ``rew_<term>``
(a field of the task's config dataclass). A task's reward table is every term whose weight is
non-zero, in :data:`REWARD_TERMS` order, so the ``reward/<term>`` logs carry exactly the
configured terms. Penalties have a raw value >= 0 and a negative weight; tracking-type terms
are kernels in (0, 1], maximal at zero error. The reward handed to the learner is
``CONTROL_DT x sum(weight x raw)`` (legged_gym / Playground convention, so returns stay
O(10)), clipped at 0 with ``positive_reward`` (the default; legged_gym's
only_positive_rewards: a step never pays less than nothing, so ending the episode by falling
never pays). The ``termination`` term is added after the clip, so a fall penalty
(``rew_termination`` < 0) is paid in full either way. ``reward/<term>`` logs ``weight x raw``
before the dt scaling and the clip.

Env state (one row per env; term functions read only these):

    joint_pos, joint_vel (N, J)      servo joint angles and velocities (sensors)
    default (J,)                      default pose: the servo targets of the keyframe
    action, prev_action (N, J)        action taken on this step and on the one before
    gyro (N, 3)                       trunk angular velocity, trunk frame (rad/s)
    lin_vel (N, 3)                    trunk linear velocity, trunk frame (m/s)
    gravity (N, 3)                    unit gravity in the trunk frame; upright_cos = -gravity z
    trunk_height (N,)                 trunk origin above the floor (m)
    command (N, 3)                    (vx, vy, yaw rate) being tracked on this step
    moving (N,)                       |command| > MOVING_COMMAND (feet terms only then)
    foot_height (N, F)                lowest point of each foot above the floor (m)
    foot_vel (N, F, 3)                world linear velocity of each foot (m/s)
    contact (N, F)                    foot touch force above the task's threshold
    touchdown (N, F)                  contact now, none on the step before
    air_time_at_touchdown (N, F)      length of the swing that ended this step (s), else 0
    foot_phase (N, F)                 gait clock + per-foot offset, in [0, 1); swing in [0, 0.5)
    fallen (N,)                       upright_cos <= the task's threshold
    task                              the task table (``gait_reference``: the reference gait)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import mujoco
import numpy as np

from raylab.envs.core.managers import (
    CommandTerm,
    EventTerm,
    ObsTerm,
    RewardTerm,
    TerminationTerm,
    reward_table,
    reward_weight_fields,
)
from raylab.envs.core.options import parse_options
from raylab.envs.core.single_env import SingleEnv
from raylab.envs.core.terms import (  # noqa: F401  (obs terms re-exported for the tasks)
    obs_action,
    obs_base_height,
    obs_base_lin_vel,
    obs_joint_vel,
    time_out,
    upright,
)
from raylab.envs.core.vec_env import BatchedVecEnv
from raylab.envs.tasks import BatchedEnvConfig, PushCurriculum, option, option_range

CONTROL_DT = 0.02  # 50 Hz control in both tasks
MOVING_COMMAND = 0.1  # |command| above this counts as "move" for the feet terms
POSE_SIGMA = 1.0  # rad^2: pose = exp(-sum (q - default)^2 / POSE_SIGMA)


# ---------------------------------------------------------------------------------------------
# Reward terms: raw values, one per env (weights are the options rew_<term>)
# ---------------------------------------------------------------------------------------------


def _sum_sq(x: np.ndarray) -> np.ndarray:
    return np.sum(x * x, axis=-1)


def tracking_lin_vel(env):
    """exp(-|cmd_xy - v_xy|^2 / tracking_sigma_lin), trunk frame; 1 at zero error."""
    e = env.command[:, :2] - env.lin_vel[:, :2]
    return np.exp(-_sum_sq(e) / env.opts.tracking_sigma_lin)


def tracking_ang_vel(env):
    """exp(-(cmd_yaw - yaw rate)^2 / tracking_sigma_ang); 1 at zero error."""
    e = env.command[:, 2] - env.gyro[:, 2]
    return np.exp(-(e * e) / env.opts.tracking_sigma_ang)


def lin_vel_z(env):
    """Vertical trunk velocity squared (penalty)."""
    v = env.lin_vel[:, 2]
    return v * v


def ang_vel_xy(env):
    """Roll and pitch rate squared (penalty)."""
    return _sum_sq(env.gyro[:, :2])


def orientation(env):
    """Tilt: squared x, y of gravity in the trunk frame (penalty); 0 when level."""
    return _sum_sq(env.gravity[:, :2])


def base_height(env):
    """(trunk height - base_height_target)^2 (penalty)."""
    e = env.trunk_height - env.opts.base_height_target
    return e * e


def action_rate(env):
    """Sum of squared action changes (penalty)."""
    return _sum_sq(env.action - env.prev_action)


def similar_to_default(env):
    """Sum of |q - default| over the servo joints (penalty)."""
    return np.sum(np.abs(env.joint_pos - env.default), axis=1)


def pose(env):
    """exp(-sum (q - default)^2 / POSE_SIGMA): 1 at the default pose."""
    return np.exp(-_sum_sq(env.joint_pos - env.default) / POSE_SIGMA)


def feet_air_time(env):
    """At each touchdown, the swing's air time minus air_time_min, at most air_time_max -
    air_time_min (negative for shuffling steps); summed over feet; 0 when the command is zero."""
    lo, hi = env.opts.air_time_min_s, env.opts.air_time_max_s
    t = np.minimum(env.air_time_at_touchdown - lo, hi - lo) * env.touchdown
    return np.sum(t, axis=1) * env.moving


def feet_swing_height(env):
    """Feet follow the gait clock: desired height swing_height x sin(2 pi phase) in swing
    (phase < 0.5), 0 in stance, and 0 for every foot when the command is zero;
    exp(-sum ((height - desired) / swing_height)^2); 1 at zero error."""
    h = env.opts.swing_height
    desired = h * np.maximum(0.0, np.sin(2.0 * np.pi * env.foot_phase)) * env.moving[:, None]
    e = (env.foot_height - desired) / h
    return np.exp(-_sum_sq(e))


def feet_contact_clock(env):
    """Feet touch the ground when the gait clock says stance: per foot +1 if its contact
    matches (stance: phase >= 0.5, or any phase with a zero command) and -1 if not, averaged
    over the feet. A robot that stands through a moving command scores 0 with a two-phase
    clock (its stance feet match, its swing feet do not); one that steps to the clock, 1."""
    stance = (env.foot_phase >= 0.5) | ~env.moving[:, None]
    return np.mean(np.where(env.contact == stance, 1.0, -1.0), axis=1)


def gait_reference(env):
    """Joints follow the task's reference gait (a joint-space walking pattern driven by the
    gait clock and the command, ``JoystickTask.gait_reference``):
    exp(-sum (q - q_ref)^2 / reference_sigma); 1 on the reference."""
    e = env.joint_pos - env.task.gait_reference(env)
    return np.exp(-_sum_sq(e) / env.opts.reference_sigma)


def foot_clearance(env):
    """Feet moving sideways away from the swing height: sum (height - swing_height)^2 x
    sqrt(|v_xy|) over feet (penalty)."""
    e = env.foot_height - env.opts.swing_height
    speed = np.sqrt(np.sqrt(_sum_sq(env.foot_vel[..., :2])))
    return np.sum(e * e * speed, axis=1)


def foot_slip(env):
    """Squared horizontal speed of the feet in contact (penalty)."""
    return np.sum(_sum_sq(env.foot_vel[..., :2]) * env.contact, axis=1)


def termination(env):
    """1 on the step the robot falls (penalty)."""
    return env.fallen.astype(np.float64)


# Every reward term a joystick task can use, in the order the reward adds them. Its weight is
# the option rew_<name>; weight 0 leaves the term out of the table and out of the logs.
REWARD_TERMS: Dict[str, Callable] = {
    "tracking_lin_vel": tracking_lin_vel,
    "tracking_ang_vel": tracking_ang_vel,
    "upright": upright,
    "lin_vel_z": lin_vel_z,
    "ang_vel_xy": ang_vel_xy,
    "orientation": orientation,
    "base_height": base_height,
    "action_rate": action_rate,
    "similar_to_default": similar_to_default,
    "pose": pose,
    "feet_air_time": feet_air_time,
    "feet_swing_height": feet_swing_height,
    "feet_contact_clock": feet_contact_clock,
    "gait_reference": gait_reference,
    "foot_clearance": foot_clearance,
    "foot_slip": foot_slip,
    "termination": termination,
}


# ---------------------------------------------------------------------------------------------
# Observation and termination terms
# ---------------------------------------------------------------------------------------------


def obs_gyro(env):
    return env.gyro


def obs_gravity(env):
    return env.gravity


def obs_joint_pos(env):
    return env.joint_pos - env.default


def obs_command(env):
    return env.command


def obs_foot_phase(env):
    """sin(2 pi phase) of each foot's gait clock (dropped when gait_freq_hz is 0)."""
    return np.sin(2.0 * np.pi * env.foot_phase)


# Privileged state (``privileged_obs``): appended after the policy's observation for an
# asymmetric critic; raylab's PPO module hides it from the policy (algorithms/modules.py).
def obs_foot_contact(env):
    return env.contact.astype(np.float64)


def obs_foot_height(env):
    return env.foot_height


def privileged_terms(num_feet: int) -> Tuple[ObsTerm, ...]:
    return (
        ObsTerm("base_lin_vel", obs_base_lin_vel, 3),
        ObsTerm("base_height", obs_base_height, 1),
        ObsTerm("foot_contact", obs_foot_contact, num_feet),
        ObsTerm("foot_height", obs_foot_height, num_feet, scale=10.0),
    )


def fell(env):
    return env.fallen


TERMINATIONS = (
    TerminationTerm("fallen", fell),
    TerminationTerm("time_out", time_out, time_out=True),
)


# ---------------------------------------------------------------------------------------------
# The robot: name lookups resolved once per model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeggedRobot:
    """Addresses of a legged robot's servos, feet and sensors in one compiled model.

    Sensors the joystick env reads (by name): ``gyro``, ``orientation``, ``trunk_pos``,
    ``local_linvel``; ``pos_<actuator>``, ``vel_<actuator>``, ``frc_<actuator>`` contiguous in
    actuator order; ``<foot>_foot_pos``, ``<foot>_foot_vel``, ``<foot>_foot_touch`` contiguous in
    foot order.
    """

    key_id: int
    root_dof: int
    floor_geom: int
    nbody: int
    act_ids: np.ndarray
    qpos_adr: np.ndarray
    dof_adr: np.ndarray
    key_qpos: np.ndarray  # (nq,) the keyframe
    default: np.ndarray  # (J,) the keyframe's servo targets: the default pose
    lower: np.ndarray
    upper: np.ndarray
    sensors: Dict[str, slice]

    @classmethod
    def of(
        cls, model: mujoco.MjModel, actuators: Tuple[str, ...], feet: Tuple[str, ...], key: str
    ) -> "LeggedRobot":
        jid = np.array([model.actuator(a).trnid[0] for a in actuators])
        act_ids = np.array([model.actuator(a).id for a in actuators])
        key_id = model.key(key).id
        sensors = {}
        for s in range(model.nsensor):
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SENSOR, s)
            adr, dim = int(model.sensor_adr[s]), int(model.sensor_dim[s])
            sensors[name] = slice(adr, adr + dim)
        blocks = {
            "joint_pos": [f"pos_{a}" for a in actuators],
            "joint_vel": [f"vel_{a}" for a in actuators],
            "joint_force": [f"frc_{a}" for a in actuators],
            "foot_pos": [f"{f}_foot_pos" for f in feet],
            "foot_vel": [f"{f}_foot_vel" for f in feet],
            "foot_touch": [f"{f}_foot_touch" for f in feet],
        }
        for group, names in blocks.items():
            missing = [n for n in names if n not in sensors]
            if missing:
                raise ValueError(f"the model has no sensor(s) {', '.join(missing)}")
            first, last = sensors[names[0]].start, sensors[names[-1]].stop
            dims = [sensors[n].stop - sensors[n].start for n in names]
            starts = [sensors[n].start for n in names]
            if starts != list(first + np.cumsum([0] + dims[:-1])) or last - first != sum(dims):
                raise ValueError(f"the {group} sensors must be contiguous, in order: {names}")
            sensors[group] = slice(first, last)
        root = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        return cls(
            key_id=key_id,
            root_dof=int(model.jnt_dofadr[root[0]]),
            floor_geom=model.geom("floor").id,
            nbody=model.nbody,
            act_ids=act_ids,
            qpos_adr=model.jnt_qposadr[jid].copy(),
            dof_adr=model.jnt_dofadr[jid].copy(),
            key_qpos=model.key_qpos[key_id].copy(),
            default=model.key_ctrl[key_id][act_ids].copy(),
            lower=model.jnt_range[jid, 0].copy(),
            upper=model.jnt_range[jid, 1].copy(),
            sensors=sensors,
        )


# ---------------------------------------------------------------------------------------------
# Domain randomisation: friction, masses, kp, kd
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainRanges:
    """Uniform ranges of the per-episode physics factors (all relative to the nominal model)."""

    friction: Tuple[float, float] = (0.5, 1.25)  # floor sliding friction
    mass: Tuple[float, float] = (0.9, 1.1)  # each body's mass and inertia, drawn per body
    kp: Tuple[float, float] = (0.85, 1.15)  # servo stiffness, one factor for all servos
    kd: Tuple[float, float] = (0.7, 1.3)  # servo damping (actuator kv and joint damping)


def draw_domain(rng: np.random.Generator, ranges: DomainRanges, nbody: int) -> Dict[str, Any]:
    """One episode's physics factors; draw order: friction, masses (bodies 1..), kp, kd."""
    friction = float(rng.uniform(*ranges.friction))
    mass = np.ones(nbody)
    mass[1:] = rng.uniform(*ranges.mass, size=nbody - 1)
    kp = float(rng.uniform(*ranges.kp))
    kd = float(rng.uniform(*ranges.kd))
    return {"friction": friction, "mass": mass, "kp": kp, "kd": kd}


def apply_domain(
    model: mujoco.MjModel,
    nominal: Dict[str, np.ndarray],
    robot: LeggedRobot,
    domain: Optional[Dict[str, Any]],
) -> None:
    """Restore the nominal fields, then (if ``domain``) write the episode's factors; values are
    always computed from the nominal arrays, so nothing compounds across episodes."""
    for name, value in nominal.items():
        getattr(model, name)[:] = value
    if domain is None:
        return
    a, dof = robot.act_ids, robot.dof_adr
    model.geom_friction[robot.floor_geom, 0] = (
        nominal["geom_friction"][robot.floor_geom, 0] * domain["friction"]
    )
    model.body_mass[:] = nominal["body_mass"] * domain["mass"]
    model.body_inertia[:] = nominal["body_inertia"] * domain["mass"][:, None]
    model.actuator_gainprm[a, 0] = nominal["actuator_gainprm"][a, 0] * domain["kp"]
    model.actuator_biasprm[a, 1] = nominal["actuator_biasprm"][a, 1] * domain["kp"]
    model.actuator_biasprm[a, 2] = nominal["actuator_biasprm"][a, 2] * domain["kd"]
    model.dof_damping[dof] = nominal["dof_damping"][dof] * domain["kd"]


# ---------------------------------------------------------------------------------------------
# Event terms
# ---------------------------------------------------------------------------------------------


def reset_physics(env, env_ids):
    """Nominal physics, or (domain_randomization) this episode's drawn factors."""
    for i in env_ids:
        dom = None
        if env.opts.domain_randomization:
            dom = draw_domain(env.rngs[i], env.task.domain, env.robot.nbody)
        env.domain[i] = dom
        apply_domain(env.sim.models[i], env.nominal, env.robot, dom)


def reset_state(env, env_ids):
    """Keyframe, joint noise (uniform +/- init_noise, clamped to the joint limits), zero
    velocities, servo targets at the default pose; clear the action, gait and feet state."""
    r = env.robot
    ctrl = np.zeros(env.sim.prototype.nu)
    ctrl[r.act_ids] = r.default
    qvel = np.zeros(env.sim.prototype.nv)
    w = env.opts.init_noise
    for i in env_ids:
        qpos = r.key_qpos.copy()
        if w > 0:
            noise = env.rngs[i].uniform(-w, w, size=r.qpos_adr.size)
            qpos[r.qpos_adr] = np.clip(qpos[r.qpos_adr] + noise, r.lower, r.upper)
        env.sim.reset_env(i, r.key_id, qpos, qvel, ctrl)
    env.step_count[env_ids] = 0
    env.action[env_ids] = 0.0
    env.prev_action[env_ids] = 0.0
    env.gait_phase[env_ids] = 0.0
    env.air_time[env_ids] = 0.0
    env.air_time_at_touchdown[env_ids] = 0.0
    env.touchdown[env_ids] = False


def push_speed(opts) -> float:
    """The push speed of these options: ``train_push_vel`` when set (training only; evaluation
    builds its env with it unset), else the task's ``push_vel``."""
    return float(opts.push_vel if opts.train_push_vel is None else opts.train_push_vel)


def reset_push_timer(env, env_ids):
    """Control steps until the first push (only drawn when pushes are on)."""
    if push_speed(env.opts) > 0:
        for i in env_ids:
            env.push_countdown[i] = env.draw_push_interval(env.rngs[i])


def interval_push(env, env_ids=None):
    """Every push_interval_s (drawn per push) add uniform(+/- the push speed: push_vel, or
    train_push_vel in training) to the trunk's vx, vy, times the training push curriculum's
    factor (1 by default and in evaluation; the draws are the same whatever the factor, and a
    factor of 0 pushes nobody)."""
    env.kick_mask[:] = False
    speed = push_speed(env.opts)
    if speed <= 0:
        return
    factor = env.opts.push_scale(env.env_steps)
    env.push_countdown[env.stepping] -= 1
    for i in np.flatnonzero(env.stepping & (env.push_countdown <= 0)):
        rng = env.rngs[i]
        kick = rng.uniform(-speed, speed, size=2)
        env.kick[i] = kick if factor == 1.0 else kick * factor
        env.kick_mask[i] = factor > 0.0
        env.push_countdown[i] = env.draw_push_interval(rng)


EVENTS = (
    EventTerm("physics", reset_physics, mode="reset"),
    EventTerm("initial_state", reset_state, mode="reset"),
    EventTerm("push_timer", reset_push_timer, mode="reset"),
    EventTerm("push", interval_push, mode="step"),
)


# ---------------------------------------------------------------------------------------------
# The task table and its options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoystickTask:
    """Everything that differs between joystick tasks, as data."""

    name: str
    config_cls: type  # the options (a dataclass of raylab.envs.tasks)
    model: Callable[[], mujoco.MjModel]  # the compiled prototype (cached; never modified)
    actuators: Tuple[str, ...]
    feet: Tuple[str, ...]
    key: str  # keyframe: initial state, and its ctrl is the default pose
    nsubsteps: int  # physics steps per control step (x timestep = CONTROL_DT)
    observations: Tuple[ObsTerm, ...]  # a term named "foot_phase" is dropped when gait is off
    foot_phase_offsets: Tuple[float, ...]  # gait clock offset of each foot (trot: 0, .5, .5, 0)
    foot_radius: float  # foot site z minus this = height of the foot's lowest point
    contact_force: float  # touch force (N) above which a foot is in contact
    fall_up_z: float  # fallen when the trunk's up axis z <= this
    domain: DomainRanges = DomainRanges()
    # env -> (N, J) servo joint targets of a walking pattern for the gait clock and the command
    # (the gait_reference reward term); None: the task has none
    gait_reference: Optional[Callable[[Any], np.ndarray]] = None


@dataclass
class JoystickConfig(PushCurriculum, BatchedEnvConfig):
    """Options shared by the joystick tasks; the defaults are the Go2's (see
    envs/tasks/legged_joystick.py).

    Reward weights are the ``rew_<term>`` fields: one per term of
    ``raylab.envs.tasks.legged_joystick.REWARD_TERMS``; weight 0 leaves the term out (it is
    neither computed nor logged). Penalties take negative weights. The learner's reward is
    0.02 s x the weighted sum.
    """

    episode_steps: int = option(1000, "control steps per episode (50 Hz); reaching it truncates")
    action_scale: float = option(0.25, "servo target = default pose + action_scale * action (rad)")
    lin_vel_x: List[float] = option_range(-1.0, 1.0, "forward velocity command range (m/s)")
    lin_vel_y: List[float] = option_range(-0.5, 0.5, "sideways velocity command range (m/s)")
    ang_vel_yaw: List[float] = option_range(-1.0, 1.0, "yaw rate command range (rad/s)")
    command_resample_s: List[float] = option_range(
        4.0, 8.0, "a new command after a time drawn uniformly from this range (s)"
    )
    train_command_resample_s: Optional[List[float]] = option(
        None,
        "training only: command_resample_s while training, e.g. [1, 3] for more changes of "
        "command per episode (null: command_resample_s); evaluation uses command_resample_s",
        training_only=True,
    )
    command_zero_prob: float = option(0.1, "share of commands that are zero (stand still)")
    gait_freq_hz: float = option(
        2.0, "gait clock frequency (Hz); 0 turns the clock and its foot-phase observation off"
    )
    swing_height: float = option(
        0.08, "apex height of a swing (m): feet_swing_height, foot_clearance"
    )
    tracking_sigma_lin: float = option(0.25, "tracking_lin_vel = exp(-|v_xy error|^2 / this)")
    tracking_sigma_ang: float = option(0.25, "tracking_ang_vel = exp(-yaw rate error^2 / this)")
    reference_sigma: float = option(
        0.5, "gait_reference = exp(-sum (q - reference q)^2 / this) (rad^2)"
    )
    base_height_target: float = option(0.30, "trunk height (m) the base_height penalty aims at")
    air_time_min_s: float = option(0.1, "feet_air_time pays air time above this (s)")
    air_time_max_s: float = option(0.5, "... up to this (s)")
    init_noise: float = option(0.05, "uniform initial joint noise (rad), clamped to joint limits")
    push_vel: float = option(
        0.0, "push: uniform +/- this (m/s) added to the trunk's vx, vy (0: off)"
    )
    push_interval_s: List[float] = option_range(
        5.0, 10.0, "time between pushes, drawn per push (s)"
    )
    train_push_vel: Optional[float] = option(
        None,
        "training only: the push speed (m/s) in place of push_vel while training, e.g. pushes "
        "for robustness on a task that has none (null: push_vel); evaluation pushes with push_vel",
        training_only=True,
    )
    domain_randomization: bool = option(
        False, "randomise floor friction, masses, kp and kd per episode"
    )
    positive_reward: bool = option(
        True, "clip each step's reward (0.02 x weighted sum) at 0, so falling never pays"
    )
    privileged_obs: bool = option(
        False,
        "append privileged state (trunk-frame velocity, trunk height, foot contacts and heights) "
        "after the observation: PPO's critic sees it, its policy does not (asymmetric critic)",
    )
    rew_tracking_lin_vel: float = option(1.0, "reward weight: linear velocity tracking (x, y)")
    rew_tracking_ang_vel: float = option(0.5, "reward weight: yaw rate tracking")
    rew_upright: float = option(0.0, "reward weight: max(0, z of the trunk's up axis)")
    rew_lin_vel_z: float = option(-2.0, "reward weight: vertical velocity squared")
    rew_ang_vel_xy: float = option(-0.05, "reward weight: roll and pitch rate squared")
    rew_orientation: float = option(-5.0, "reward weight: tilt (gravity x, y in the trunk frame)^2")
    rew_base_height: float = option(-10.0, "reward weight: (trunk height - base_height_target)^2")
    rew_action_rate: float = option(-0.01, "reward weight: sum of squared action changes")
    rew_similar_to_default: float = option(-0.05, "reward weight: sum |q - default pose|")
    rew_pose: float = option(0.0, "reward weight: exp(-sum (q - default pose)^2)")
    rew_feet_air_time: float = option(0.0, "reward weight: air time of each finished swing")
    rew_feet_swing_height: float = option(
        1.0, "reward weight: feet follow the gait clock's heights"
    )
    rew_feet_contact_clock: float = option(
        0.0, "reward weight: feet in contact in the clock's stance, off the ground in its swing"
    )
    rew_gait_reference: float = option(
        0.0, "reward weight: joints follow the task's reference gait (needs the gait clock)"
    )
    residual_reference: bool = option(
        False,
        "actions are offsets from the task's reference gait instead of the default pose: servo "
        "target = reference + action_scale * action (needs the gait clock and a task with a "
        "reference gait)",
    )
    rew_foot_clearance: float = option(0.0, "reward weight: feet moving below the swing height")
    rew_foot_slip: float = option(-0.1, "reward weight: squared speed of the feet in contact")
    rew_termination: float = option(
        0.0, "reward weight: 1 on the step the robot falls (added after positive_reward's clip)"
    )

    def check(self) -> None:
        check_joystick_options(self)


def check_joystick_options(o) -> None:
    """The value checks of a joystick task's options (run by
    :func:`~raylab.envs.core.options.parse_options`)."""

    def bad(msg):
        raise ValueError(msg)

    if int(o.episode_steps) < 1:
        bad(f"episode_steps={o.episode_steps} is invalid; it must be >= 1")
    ranges = ["lin_vel_x", "lin_vel_y", "ang_vel_yaw", "command_resample_s", "push_interval_s"]
    if o.train_command_resample_s is not None:
        ranges.append("train_command_resample_s")
    for name in ranges:
        r = list(getattr(o, name))
        if len(r) != 2 or not all(math.isfinite(float(v)) for v in r) or r[0] > r[1]:
            bad(f"{name}={r} is invalid; it must be [low, high] with low <= high")
    for name in ranges[3:]:
        if float(getattr(o, name)[0]) < CONTROL_DT:
            bad(f"{name}={list(getattr(o, name))} is invalid; both ends must be >= {CONTROL_DT} s")
    if not 0.0 <= float(o.command_zero_prob) <= 1.0:
        bad(f"command_zero_prob={o.command_zero_prob} is invalid; valid range: 0..1")
    for name in ("action_scale", "init_noise", "push_vel", "gait_freq_hz"):
        v = float(getattr(o, name))
        if not math.isfinite(v) or v < 0:
            bad(f"{name}={v} is invalid; it must be finite and >= 0")
    if o.train_push_vel is not None:
        v = float(o.train_push_vel)
        if not math.isfinite(v) or v < 0:
            bad(f"train_push_vel={v} is invalid; it must be null or finite and >= 0")
    for name in ("swing_height", "tracking_sigma_lin", "tracking_sigma_ang", "reference_sigma"):
        v = float(getattr(o, name))
        if not math.isfinite(v) or v <= 0:
            bad(f"{name}={v} is invalid; it must be finite and > 0")
    if not 0 <= o.air_time_min_s <= o.air_time_max_s:
        bad(
            f"air_time_min_s={o.air_time_min_s}, air_time_max_s={o.air_time_max_s} are invalid; "
            "need 0 <= air_time_min_s <= air_time_max_s"
        )
    for name in reward_weight_fields(type(o)):
        if not math.isfinite(float(getattr(o, name))):
            bad(f"{name}={getattr(o, name)} is invalid; a reward weight must be finite")
    for name in ("rew_feet_swing_height", "rew_feet_contact_clock", "rew_gait_reference"):
        if o.gait_freq_hz == 0 and getattr(o, name) != 0:
            bad(f"{name} needs the gait clock; set gait_freq_hz > 0 or the weight to 0")
    if o.residual_reference and o.gait_freq_hz == 0:
        bad("residual_reference=true needs the gait clock; set gait_freq_hz > 0")
    o.check_push_curriculum()


def rewards(opts) -> Tuple[RewardTerm, ...]:
    """The configured reward terms: every term of REWARD_TERMS with a non-zero weight."""
    return reward_table(REWARD_TERMS, opts)


def observation_table(task: JoystickTask, opts) -> Tuple[ObsTerm, ...]:
    """The policy's terms (foot_phase only with a gait clock); ``privileged_obs`` appends
    :func:`privileged_terms` after them."""
    return tuple(t for t in task.observations if opts.gait_freq_hz > 0 or t.name != "foot_phase")


def _steps(seconds: float) -> int:
    return max(1, int(round(float(seconds) / CONTROL_DT)))


# ---------------------------------------------------------------------------------------------
# The vector env
# ---------------------------------------------------------------------------------------------


class JoystickVecEnv(BatchedVecEnv):
    """N robots tracking velocity commands, on T physics threads; a ``gymnasium.vector.VectorEnv``.

    Subclasses set :attr:`task`. Options: the fields of the task's config dataclass, plus
    ``num_threads``, ``allow_overcommit``, ``autoreset_mode`` ("next_step" | "same_step") and
    ``info_mode``:

    - ``"none"`` (default): ``infos`` is ``{}`` (same_step: only ``final_obs`` / ``_final_obs``
      when an episode ended); safe under RLlib's DictInfoToList.
    - ``"full"``: per-env arrays ``trunk_height``, ``upright_cos``, ``fallen``, ``pushed``,
      ``step``, ``command`` (the command tracked on this step), ``lin_vel``, ``yaw_rate``, a
      ``reward_terms`` dict (weight x raw) and ``infos["log"]`` with this step's
      ``reward/<term>`` means and ``Episode_Termination/<term>`` counts.

    Seeding: ``reset(seed=s)`` seeds env i with ``s + i``; every draw of env i (domain, initial
    noise, commands, pushes) comes from its own generator, so nothing depends on N or T.
    """

    task: JoystickTask

    def _configure(self, options):
        self.opts = parse_options(self.task.config_cls, options)
        if self.opts.rew_gait_reference != 0 and self.task.gait_reference is None:
            raise ValueError(
                f"rew_gait_reference={self.opts.rew_gait_reference} needs a reference gait, which "
                f"{self.task.name} does not have (microduck_joystick has one); set it to 0"
            )
        if self.opts.residual_reference and self.task.gait_reference is None:
            raise ValueError(
                f"residual_reference=true needs a reference gait, which {self.task.name} does "
                "not have (microduck_joystick has one); set it to false"
            )
        proto = self.task.model()
        self.robot = LeggedRobot.of(proto, self.task.actuators, self.task.feet, self.task.key)
        return proto, self.task.nsubsteps

    def _build(self) -> None:
        n = self.num_envs
        nj, nf = len(self.task.actuators), len(self.task.feet)

        # Env state: plain arrays, one row per env.
        self.default = self.robot.default
        self.episode_steps = self.opts.episode_steps
        self.action = np.zeros((n, nj))
        self.prev_action = np.zeros((n, nj))
        self.gait_phase = np.zeros(n)
        self.phase_offsets = np.asarray(self.task.foot_phase_offsets, dtype=np.float64)
        self.contact = np.zeros((n, nf), dtype=bool)
        self.touchdown = np.zeros((n, nf), dtype=bool)
        self.air_time = np.zeros((n, nf))
        self.air_time_at_touchdown = np.zeros((n, nf))
        self.command = np.zeros((n, 3))  # the command tracked on the current step
        self.moving = np.zeros(n, dtype=bool)
        self.push_countdown = np.zeros(n, dtype=np.int64)
        self.env_steps = 0  # steps of all envs so far, for a training push curriculum
        self.domain: List[Optional[Dict[str, Any]]] = [None] * n

        o = self.opts
        resample = o.command_resample_s
        if o.train_command_resample_s is not None:  # training only: evaluation leaves it unset
            resample = o.train_command_resample_s
        velocity = CommandTerm(
            "velocity",
            (tuple(o.lin_vel_x), tuple(o.lin_vel_y), tuple(o.ang_vel_yaw)),
            resample_steps=(_steps(resample[0]), _steps(resample[1])),
            zero_prob=float(o.command_zero_prob),
        )
        self._init_managers(
            nj,
            observation_table(self.task, o),
            privileged_terms(nf) if o.privileged_obs else (),
            rewards(o),
            TERMINATIONS,
            (velocity,),
            EVENTS,
        )

    def draw_push_interval(self, rng: np.random.Generator) -> int:
        lo, hi = self.opts.push_interval_s
        return int(rng.integers(_steps(lo), _steps(hi) + 1))

    # -- sensors -----------------------------------------------------------------------------

    def _read_sensors(self) -> None:
        super()._read_sensors()  # joints, gyro, lin_vel, trunk_height, gravity, upright_cos
        sd, s = self.sim.sensordata, self.robot.sensors
        n, nf = self.num_envs, len(self.task.feet)
        self.fallen = self.upright_cos <= self.task.fall_up_z
        self.foot_height = sd[:, s["foot_pos"]].reshape(n, nf, 3)[:, :, 2] - self.task.foot_radius
        self.foot_vel = sd[:, s["foot_vel"]].reshape(n, nf, 3)
        self.foot_force = sd[:, s["foot_touch"]]
        self.foot_phase = (self.gait_phase[:, None] + self.phase_offsets) % 1.0

    def _update_feet(self, ids: np.ndarray) -> None:
        """Contacts, touchdowns and air times of the envs ``ids`` after their physics step."""
        contact = self.foot_force[ids] > self.task.contact_force
        air = self.air_time[ids] + CONTROL_DT
        touchdown = contact & ~self.contact[ids]
        self.touchdown[ids] = touchdown
        self.air_time_at_touchdown[ids] = np.where(touchdown, air, 0.0)
        self.air_time[ids] = np.where(contact, 0.0, air)
        self.contact[ids] = contact

    def _set_command(self) -> None:
        self.command[:] = self.commands.get("velocity")
        self.moving[:] = np.sqrt(_sum_sq(self.command)) > MOVING_COMMAND

    # -- reset -------------------------------------------------------------------------------

    def _reset_info(self) -> Dict[str, Any]:
        return self._state_info()

    def _reset_envs(self, env_ids: np.ndarray) -> None:
        """Events (physics, initial state, push timer), the first command, the sensors, then
        the feet's contacts and the command state."""
        super()._reset_envs(env_ids)
        self.contact[env_ids] = self.foot_force[env_ids] > self.task.contact_force
        self._set_command()

    # -- step --------------------------------------------------------------------------------

    def _apply_actions(self, actions: np.ndarray, ids: np.ndarray) -> None:
        self.prev_action[ids] = self.action[ids]
        self.action[ids] = actions[ids]
        # residual_reference: the offsets are from the reference gait at the clock and command
        # the observation showed (foot_phase and command are those of the last observation)
        base = self.task.gait_reference(self) if self.opts.residual_reference else self.default
        target = np.clip(
            base + self.opts.action_scale * self.action, self.robot.lower, self.robot.upper
        )
        self.ctrl[:, self.robot.act_ids] = target

    def _after_physics(self, active: np.ndarray, resetting: np.ndarray):
        ids = np.flatnonzero(active)
        self.env_steps += len(ids)
        self.gait_phase[ids] = (self.gait_phase[ids] + self.opts.gait_freq_hz * CONTROL_DT) % 1.0

        self._read_sensors()
        self._update_feet(ids)
        reward = CONTROL_DT * self.rewards.compute(self, active)
        if self.opts.positive_reward:
            # The clip leaves the fall penalty out (legged_gym's order: clip, then add it), so
            # rew_termination still costs a fall what it says.
            fall = CONTROL_DT * self.rewards.weighted_term("termination")
            reward = np.maximum(reward - fall, 0.0) + fall
        terminated, truncated = self.terminations.compute(self, active)
        terminated, truncated = terminated.copy(), truncated.copy()

        info: Dict[str, Any] = {}
        if self.info_mode == "full":
            info = self._state_info()
            info["pushed"] = self.kick_mask.copy()
            info.update(self._full_step_info(active))

        # The next command (resampled when due) is what the observation shows.
        self.commands.step(active, self.rngs)
        self._set_command()
        obs = self.observations.compute(self, fresh=np.flatnonzero(resetting)).copy()
        return obs, reward, terminated, truncated, info

    def _state_info(self) -> Dict[str, np.ndarray]:
        return {
            "trunk_height": self.trunk_height.copy(),
            "upright_cos": self.upright_cos.copy(),
            "fallen": self.fallen.copy(),
            "step": self.step_count.copy(),
            "command": self.command.copy(),
            "lin_vel": self.lin_vel.copy(),
            "yaw_rate": self.gyro[:, 2].copy(),
        }

    # -- logging -----------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# One robot behind gymnasium.Env (gymnasium.make, raylab eval)
# ---------------------------------------------------------------------------------------------


class JoystickEnv(SingleEnv):
    """The joystick vector env with one robot. ``info``: ``trunk_height``, ``upright_cos``,
    ``fallen``, ``step``, ``command``, ``lin_vel``, ``yaw_rate``, ``pushed`` and
    ``reward_terms`` (weight x raw, before the dt scaling)."""

    vec_cls: type = JoystickVecEnv
    metadata = {"render_modes": [], "render_fps": int(round(1.0 / CONTROL_DT))}
