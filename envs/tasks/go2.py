"""Go2-like quadruped joystick task on flat ground: ``raylab/Go2JoystickFlat-v0``.

The model is raylab's own MJCF (``assets/go2.xml``); the task is the table :data:`TASK` run by
:class:`~raylab.envs.tasks.legged_joystick.JoystickVecEnv` (batched, ``gymnasium.make_vec(...,
vectorization_mode="vector_entry_point")``) and
:class:`~raylab.envs.tasks.legged_joystick.JoystickEnv` (one robot, ``gymnasium.make``). Options:
``Go2JoystickFlatConfig`` (below).

Observation (49, float32), in this order: gyro x 0.25 (3), projected gravity (3), joint
position - default (12), joint velocity x 0.05 (12), last action (12), command (vx, vy, yaw
rate) (3), sin(2 pi phase) of the 4 feet's gait clock (4; trot: FR and RL together, FL and RR
half a period later).

Tracking errors of a trained policy: ``raylab eval RUN_DIR`` or ``python -m raylab.evaluate
track-error RUN_DIR``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mujoco

from raylab.envs import asset_path
from raylab.envs.core.managers import ObsTerm
from raylab.envs.tasks import option
from raylab.envs.tasks.legged_joystick import (
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

LEGS = ("FR", "FL", "RR", "RL")
ACTUATOR_NAMES = tuple(f"{leg}_{part}" for leg in LEGS for part in ("hip", "thigh", "calf"))
NUM_ACTIONS = len(ACTUATOR_NAMES)  # 12
HOME_POSE = (0.0, 0.9, -1.8)  # per leg: hip, thigh, calf (rad)
FOOT_RADIUS = 0.022


@functools.lru_cache(maxsize=None)
def prototype() -> mujoco.MjModel:
    """The compiled Go2-like model, built once per process. Do not modify it: copy it
    (``copy.copy(model)`` is ``mj_copyModel``)."""
    return mujoco.MjModel.from_xml_path(str(asset_path("go2.xml")))


OBSERVATIONS = (
    ObsTerm("gyro", obs_gyro, 3, scale=0.25),
    ObsTerm("projected_gravity", obs_gravity, 3),
    ObsTerm("joint_pos", obs_joint_pos, NUM_ACTIONS),
    ObsTerm("joint_vel", obs_joint_vel, NUM_ACTIONS, scale=0.05),
    ObsTerm("last_action", obs_action, NUM_ACTIONS),
    ObsTerm("command", obs_command, 3),
    ObsTerm("foot_phase", obs_foot_phase, len(LEGS)),
)


@dataclass
class Go2JoystickFlatConfig(JoystickConfig):
    """Go2-like quadruped on flat ground: the JoystickConfig defaults, with the tracking
    weights of the public Go2 velocity task (1.5 / 0.75 where the generic legged task has 1.0 /
    0.5). With 1.0 / 0.5, PPO's 20-minute runs tracked the linear command to 0.26 / 0.45 / 0.47
    m/s on seeds 0 / 1 / 2 (target 0.35); with these, seed 2 reached 0.13 (benchmarks/README.md,
    "Learning", the Go2 paragraphs)."""

    rew_tracking_lin_vel: float = option(1.5, "reward weight: linear velocity tracking (x, y)")
    rew_tracking_ang_vel: float = option(0.75, "reward weight: yaw rate tracking")


TASK = JoystickTask(
    name="go2_joystick_flat",
    config_cls=Go2JoystickFlatConfig,
    model=prototype,
    actuators=ACTUATOR_NAMES,
    feet=LEGS,
    key="home",
    nsubsteps=5,  # 5 x 0.004 s = 50 Hz control
    observations=OBSERVATIONS,
    foot_phase_offsets=(0.0, 0.5, 0.5, 0.0),  # trot: FR + RL, then FL + RR
    foot_radius=FOOT_RADIUS,
    contact_force=1.0,  # N (the robot weighs 149 N)
    fall_up_z=0.5,
)


class Go2JoystickFlatVecEnv(JoystickVecEnv):
    """N Go2-like robots tracking velocity commands on flat ground (batched)."""

    task = TASK


class Go2JoystickFlatEnv(JoystickEnv):
    """One Go2-like robot tracking velocity commands on flat ground."""

    vec_cls = Go2JoystickFlatVecEnv
