"""Microduck walking on velocity commands: ``raylab/MicroduckJoystick-v0``.

The robot is the Microduck balance model (``assets/microduck.xml``, loaded from the same file),
with foot sites and sensors added at build time with ``MjSpec`` (the balance task's model and
its sensordata layout are untouched: the new sensors come after the existing ones):

- ``<side>_foot_touch``: a box site 1 mm larger than the foot box, with a touch sensor (contact);
- ``<side>_sole``: a site at the centre of the sole, with ``<side>_foot_pos`` (framepos) and
  ``<side>_foot_vel`` (framelinvel) sensors (swing height, clearance, slip).

The task is the table :data:`TASK` run by
:class:`~raylab.envs.tasks.legged_joystick.JoystickVecEnv`; options:
``MicroduckJoystickConfig`` (below). Observation (51 float32, 53 with the gait clock): the
48 balance channels in the balance order and scales (joint position - stand (14), joint velocity x
0.05 (14), last action (14), gyro x 0.25 (3), projected gravity (3)), then the command (vx, vy, yaw
rate) (3), then (only when ``gait_freq_hz > 0``) sin(2 pi phase) of each foot (2).

The task has a reference gait (:func:`gait_reference`, the ``gait_reference`` reward term): the
joint angles of a walk that follows the gait clock and the command, planned as ankle paths in
each leg's hip frame and turned into joint angles by the leg's inverse kinematics.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import List, Tuple

import mujoco
import numpy as np

from raylab.envs import asset_path
from raylab.envs.core.managers import ObsTerm
from raylab.envs.robots.microduck import (
    ACTUATOR_NAMES,
    FRICTION_SCALE_RANGE,
    MASS_SCALE_RANGE,
    NUM_ACTIONS,
)
from raylab.envs.tasks import option, option_range
from raylab.envs.tasks.legged_joystick import (
    DomainRanges,
    JoystickConfig,
    JoystickEnv,
    JoystickTask,
    JoystickVecEnv,
    obs_action,
    obs_command,
    obs_foot_phase,
    obs_gravity,
    obs_gyro,
    obs_joint_pos,
    obs_joint_vel,
)

FEET = ("left", "right")
# Foot box of microduck.xml: half-size (0.036, 0.019, 0.004) at (0.01, 0, -0.00735) in <side>_foot.
FOOT_BOX_POS = (0.01, 0.0, -0.00735)
FOOT_BOX_HALF = (0.036, 0.019, 0.004)


@functools.lru_cache(maxsize=None)
def prototype() -> mujoco.MjModel:
    """The balance model plus foot sites and sensors, built once per process (do not modify)."""
    spec = mujoco.MjSpec.from_file(str(asset_path("microduck.xml")))
    x, y, z = FOOT_BOX_POS
    hx, hy, hz = FOOT_BOX_HALF
    for side in FEET:
        foot = spec.body(f"{side}_foot")
        foot.add_site(
            name=f"{side}_foot_touch",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[hx + 0.001, hy + 0.001, hz + 0.002],
            pos=[x, y, z],
        )
        foot.add_site(name=f"{side}_sole", pos=[x, y, z - hz])
    for kind, sensor, obj in (
        ("pos", mujoco.mjtSensor.mjSENS_FRAMEPOS, "sole"),
        ("vel", mujoco.mjtSensor.mjSENS_FRAMELINVEL, "sole"),
        ("touch", mujoco.mjtSensor.mjSENS_TOUCH, "foot_touch"),
    ):
        for side in FEET:
            spec.add_sensor(
                name=f"{side}_foot_{kind}",
                type=sensor,
                objtype=mujoco.mjtObj.mjOBJ_SITE,
                objname=f"{side}_{obj}",
            )
    return spec.compile()


# ---------------------------------------------------------------------------------------------
# The reference gait
# ---------------------------------------------------------------------------------------------

# Leg geometry of microduck.xml (m): the hip pitch, knee and ankle axes are parallel (y); thigh
# and shin are equally long, so with the foot kept level the ankle lies on the bisector of the two
# links. Hip roll axis to hip pitch axis, and ankle axis to sole, are straight down at the stand.
LINK = 0.0347  # thigh = shin
ROLL_TO_PITCH = 0.004
ANKLE_TO_SOLE = 0.00735 + 0.004
STAND_BEND = 0.14  # half the knee's bend in the stand keyframe (hip pitch 0.14, knee -0.28)
STAND_REACH = 2.0 * LINK * math.cos(STAND_BEND)  # hip pitch axis to ankle axis at the stand
MIN_BEND = 0.05  # the reference never straightens a leg further than this half-bend (rad)
MAX_HALF_STRIDE = 0.025  # m: the ankle at most this far before or behind the hip (21 degrees)
# (hip_yaw, hip_roll, hip_pitch, knee, ankle) of each foot, as indices into ACTUATOR_NAMES
LEG_JOINTS: Tuple[Tuple[int, ...], ...] = tuple(
    tuple(
        ACTUATOR_NAMES.index(f"{side}_{j}")
        for j in ("hip_yaw", "hip_roll", "hip_pitch", "knee", "ankle")
    )
    for side in FEET
)


def leg_ik(x: np.ndarray, z: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hip pitch, knee and ankle angles that put the ankle axis at (x, z) in the hip pitch frame
    (x forward, z up) with the foot level. A point out of reach is pulled in along its ray to the
    reach of a leg bent by MIN_BEND."""
    reach = np.minimum(np.hypot(x, z), 2.0 * LINK * math.cos(MIN_BEND))
    direction = np.arctan2(-x, -z)  # the bisector's angle; a positive pitch swings the foot back
    bend = np.arccos(reach / (2.0 * LINK))
    return direction + bend, -2.0 * bend, bend - direction


def _sweep(phase: np.ndarray) -> np.ndarray:
    """Where a foot is along its stride, -1 (back) to 1 (front): forward in swing (phase < 0.5,
    a half cosine), back at constant speed in stance (the foot stays put while the body moves)."""
    swing = phase < 0.5
    u = np.where(swing, phase, phase - 0.5) * 2.0
    return np.where(swing, -np.cos(np.pi * u), 1.0 - 2.0 * u)


def gait_reference(env) -> np.ndarray:
    """(N, 14) servo targets of a walk at the command. In stance each leg pivots about its ankle
    as a strut of the stand's length (knee at the stand's bend, the hip passing over the foot on
    an arc) and sweeps the command's displacement over one stance back (vx / (2 gait_freq_hz),
    at most MAX_HALF_STRIDE either side of the stand); in swing it swings forward along the same
    arc, the ankle lifted by reference_lift at mid-swing; the stride is centred reference_lean
    behind the hip (the duck's knees bend backwards and its stepping tips it back; a stride
    centred a few mm behind the hip moves its weight forward over the feet). Sideways commands
    roll the hips and
    yaw commands turn the hip yaws the same way. The default pose with a zero command; head and
    neck at the default always."""
    o = env.opts
    n = env.command.shape[0]
    stance_s = 0.5 / o.gait_freq_hz
    half_x = np.clip(0.5 * env.command[:, 0] * stance_s, -MAX_HALF_STRIDE, MAX_HALF_STRIDE)
    leg = ROLL_TO_PITCH + STAND_REACH + ANKLE_TO_SOLE
    half_roll = np.arcsin(np.clip(0.5 * env.command[:, 1] * stance_s / leg, -0.5, 0.5))
    half_yaw = 0.5 * env.command[:, 2] * stance_s
    sweep = _sweep(env.foot_phase)  # (N, F)
    x = half_x[:, None] * sweep - o.reference_lean
    lift = o.reference_lift * np.maximum(0.0, np.sin(2.0 * np.pi * env.foot_phase))
    pitch, knee, ankle = leg_ik(x, lift - np.sqrt(STAND_REACH**2 - x * x))
    q = np.broadcast_to(env.default, (n, env.default.size)).copy()
    for f, (yaw_j, roll_j, pitch_j, knee_j, ankle_j) in enumerate(LEG_JOINTS):
        walk = env.moving
        q[walk, yaw_j] = env.default[yaw_j] + (half_yaw * sweep[:, f])[walk]
        q[walk, roll_j] = env.default[roll_j] + (half_roll * sweep[:, f])[walk]
        q[walk, pitch_j] = pitch[walk, f]
        q[walk, knee_j] = knee[walk, f]
        q[walk, ankle_j] = ankle[walk, f]
    return np.clip(q, env.robot.lower, env.robot.upper)


OBSERVATIONS = (
    ObsTerm("joint_pos", obs_joint_pos, NUM_ACTIONS),
    ObsTerm("joint_vel", obs_joint_vel, NUM_ACTIONS, scale=0.05),
    ObsTerm("last_action", obs_action, NUM_ACTIONS),
    ObsTerm("gyro", obs_gyro, 3, scale=0.25),
    ObsTerm("projected_gravity", obs_gravity, 3),
    ObsTerm("command", obs_command, 3),
    ObsTerm("foot_phase", obs_foot_phase, len(FEET)),
)


@dataclass
class MicroduckJoystickConfig(JoystickConfig):
    """Microduck walking on commands (weights and ranges from the upstream walking variant)."""

    action_scale: float = option(0.35, "servo target = stand pose + action_scale * action (rad)")
    lin_vel_x: List[float] = option_range(-0.4, 0.4, "forward velocity command range (m/s)")
    lin_vel_y: List[float] = option_range(-0.3, 0.3, "sideways velocity command range (m/s)")
    ang_vel_yaw: List[float] = option_range(-1.0, 1.0, "yaw rate command range (rad/s)")
    gait_freq_hz: float = option(
        0.0, "gait clock frequency (Hz); 0 turns the clock and its foot-phase observation off"
    )
    swing_height: float = option(
        0.03, "apex height of a swing (m): feet_swing_height, foot_clearance"
    )
    reference_lift: float = option(0.008, "reference gait: the ankle's lift at mid-swing (m)")
    reference_lean: float = option(
        0.005, "reference gait: the hips walk this far ahead of the middle of the stride (m)"
    )
    tracking_sigma_lin: float = option(0.1, "tracking_lin_vel = exp(-|v_xy error|^2 / this)")
    tracking_sigma_ang: float = option(0.5, "tracking_ang_vel = exp(-yaw rate error^2 / this)")
    base_height_target: float = option(0.12, "trunk height (m) the base_height penalty aims at")
    air_time_min_s: float = option(0.125, "feet_air_time pays air time above this (s)")
    air_time_max_s: float = option(0.3, "... up to this (s)")
    init_noise: float = option(0.02, "uniform initial joint noise (rad), clamped to joint limits")
    push_vel: float = option(
        0.3, "push: uniform +/- this (m/s) added to the trunk's vx, vy (0: off)"
    )
    push_interval_s: List[float] = option_range(3.0, 6.0, "time between pushes, drawn per push (s)")
    rew_tracking_lin_vel: float = option(2.0, "reward weight: linear velocity tracking (x, y)")
    rew_tracking_ang_vel: float = option(2.0, "reward weight: yaw rate tracking")
    rew_upright: float = option(2.0, "reward weight: max(0, z of the trunk's up axis)")
    rew_lin_vel_z: float = option(0.0, "reward weight: vertical velocity squared")
    rew_ang_vel_xy: float = option(0.0, "reward weight: roll and pitch rate squared")
    rew_orientation: float = option(0.0, "reward weight: tilt (gravity x, y in the trunk frame)^2")
    rew_base_height: float = option(0.0, "reward weight: (trunk height - base_height_target)^2")
    rew_action_rate: float = option(-0.1, "reward weight: sum of squared action changes")
    rew_similar_to_default: float = option(0.0, "reward weight: sum |q - default pose|")
    rew_pose: float = option(1.0, "reward weight: exp(-sum (q - default pose)^2)")
    rew_feet_air_time: float = option(3.0, "reward weight: air time of each finished swing")
    rew_feet_swing_height: float = option(
        0.0, "reward weight: feet follow the gait clock's heights"
    )
    rew_foot_clearance: float = option(-2.0, "reward weight: feet moving below the swing height")
    rew_foot_slip: float = option(-0.1, "reward weight: squared speed of the feet in contact")

    def check(self) -> None:
        super().check()
        for name, low, high in (("reference_lift", 0.0, 0.02), ("reference_lean", -0.02, 0.02)):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and low <= v <= high):
                raise ValueError(f"{name}={v} is invalid; valid range: {low}..{high} (m)")


TASK = JoystickTask(
    name="microduck_joystick",
    config_cls=MicroduckJoystickConfig,
    model=prototype,
    actuators=ACTUATOR_NAMES,
    feet=FEET,
    key="stand",
    nsubsteps=10,  # 10 x 0.002 s = 50 Hz control
    observations=OBSERVATIONS,
    foot_phase_offsets=(0.0, 0.5),
    foot_radius=0.0,  # the sole site is the foot's lowest point
    contact_force=0.1,  # N (the robot weighs 7.3 N)
    fall_up_z=0.5,
    domain=DomainRanges(
        friction=FRICTION_SCALE_RANGE, mass=MASS_SCALE_RANGE, kp=(0.9, 1.1), kd=(0.85, 1.15)
    ),
    gait_reference=gait_reference,
)


class MicroduckJoystickVecEnv(JoystickVecEnv):
    """N Microducks walking on velocity commands (batched)."""

    task = TASK


class MicroduckJoystickEnv(JoystickEnv):
    """One Microduck walking on velocity commands."""

    vec_cls = MicroduckJoystickVecEnv
