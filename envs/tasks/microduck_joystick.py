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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List

import mujoco

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
)


class MicroduckJoystickVecEnv(JoystickVecEnv):
    """N Microducks walking on velocity commands (batched)."""

    task = TASK


class MicroduckJoystickEnv(JoystickEnv):
    """One Microduck walking on velocity commands."""

    vec_cls = MicroduckJoystickVecEnv
