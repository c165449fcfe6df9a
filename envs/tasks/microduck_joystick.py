"""Microduck walking on velocity commands: ``raylab/MicroduckJoystick-v0``.

The robot is the Microduck balance model (``assets/microduck.xml``, loaded from the same file),
with foot sites and sensors added at build time with ``MjSpec`` (the balance task's model and
its sensordata layout are untouched: the new sensors come after the existing ones):

- ``<side>_foot_touch``: a box site 1 mm larger than the foot box, with a touch sensor (contact);
- ``<side>_sole``: a site at the centre of the sole, with ``<side>_foot_pos`` (framepos) and
  ``<side>_foot_vel`` (framelinvel) sensors (swing height, clearance, slip).

The task is the table :data:`TASK` run by
:class:`~raylab.envs.tasks.legged_joystick.JoystickVecEnv`; options:
``raylab.envs.tasks.MicroduckJoystickConfig``. Observation (51 float32, 53 with the gait clock): the
48 balance channels in the balance order and scales (joint position - stand (14), joint velocity x
0.05 (14), last action (14), gyro x 0.25 (3), projected gravity (3)), then the command (vx, vy, yaw
rate) (3), then (only when ``gait_freq_hz > 0``) sin(2 pi phase) of each foot (2).
"""

from __future__ import annotations

import functools

import mujoco

from raylab.envs import asset_path
from raylab.envs.core.managers import ObsTerm
from raylab.envs.tasks import MicroduckJoystickConfig
from raylab.envs.tasks.legged_joystick import (
    DomainRanges,
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
from raylab.envs.tasks.microduck_balance import (
    ACTUATOR_NAMES,
    FRICTION_SCALE_RANGE,
    MASS_SCALE_RANGE,
    NUM_ACTIONS,
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
