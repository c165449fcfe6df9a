"""The Microduck robot: its model and variants, name lookups, survival, domain randomisation.

Shared by every Microduck task (``microduck_balance``, ``microduck_joystick``) and by the
balance task's reference env. Servo values and dimensions: the robot facts (docs/envs.md).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import mujoco
import numpy as np

from raylab.envs import asset_path
from raylab.envs.core.vec_env import check_choice

ACTUATOR_NAMES: Tuple[str, ...] = (
    "left_hip_yaw",
    "left_hip_roll",
    "left_hip_pitch",
    "left_knee",
    "left_ankle",
    "neck_pitch",
    "head_pitch",
    "head_yaw",
    "head_roll",
    "right_hip_yaw",
    "right_hip_roll",
    "right_hip_pitch",
    "right_knee",
    "right_ankle",
)
NUM_ACTIONS = len(ACTUATOR_NAMES)
N_SUBSTEPS = 10  # mj_step per control step: 10 x 0.002 s = 50 Hz control
CONTROL_DT = 0.02
STAND_HEIGHT = 0.12  # trunk origin in the "stand" keyframe (m)
# Survival: a step counts as survived while the duck is up, with its trunk at least 3/4 of the
# stand height above the floor and tilted less than 60 degrees. A fallen duck rests with its
# trunk at 3-6 cm and tilted far over, so neither a duck lying on the floor nor one that has sat
# down counts; a standing duck, even one leaning into a push or crouching as far as the default
# action scale allows (about 11.5 cm), does.
SURVIVAL_MIN_HEIGHT = 0.75 * STAND_HEIGHT  # m
SURVIVAL_MIN_UPRIGHT = 0.5  # cosine of the trunk's tilt (60 degrees)
MAX_LATENCY = 2  # control steps (an action's delay to the servos: 0-2)
BACKLASH_RAD = 0.002  # free play of the backlash variant's passive hinges (see docs/envs.md)
VARIANTS = ("default", "backlash", "toes")

# Domain randomisation. The servo parameters are drawn uniformly between the smallest and the
# largest value of four actuator fits. These four rows are raylab's own set, shaped like the
# upstream XL330 fits: the first is the model's nominal servo (kp 0.55 N.m/rad, damping 0.053,
# frictionloss 0.0048, armature 0.0018, force limit 0.96 N.m) and each range is centred on it;
# frictionloss spans about 6.7x (0.0019-0.0124), so its range is centred geometrically.
SERVO_FITS: Dict[str, Tuple[float, float, float, float]] = {
    "kp": (0.55, 0.49, 0.61, 0.52),
    "damping": (0.053, 0.046, 0.060, 0.050),
    "frictionloss": (0.0048, 0.0019, 0.0124, 0.0072),
    "armature": (0.0018, 0.0015, 0.0021, 0.0017),
    "force_limit": (0.96, 0.90, 1.02, 0.94),
}
SERVO_PARAMS = tuple(SERVO_FITS)
MASS_SCALE_RANGE = (0.85, 1.15)  # per body, applied to mass and inertia
FRICTION_SCALE_RANGE = (0.6, 1.2)  # floor sliding friction
DR_LATENCY_RANGE = (0, MAX_LATENCY)  # inclusive
DR_INIT_NOISE_RANGE = (0.02, 0.3)  # rad


def is_fallen(trunk_height, upright_cos):
    """Whether the duck is down (scalars or arrays): the one survival definition of the task,
    used by both envs' ``info["fallen"]``, their episode statistics, ``raylab eval`` and the
    baselines."""
    return (trunk_height < SURVIVAL_MIN_HEIGHT) | (upright_cos < SURVIVAL_MIN_UPRIGHT)


# ---------------------------------------------------------------------------------------------
# Model and variants
# ---------------------------------------------------------------------------------------------


def _hinges_of(spec: mujoco.MjSpec):
    return [j for j in spec.joints if j.type == mujoco.mjtJoint.mjJNT_HINGE]


def _add_backlash(spec: mujoco.MjSpec) -> None:
    """A passive +/-BACKLASH_RAD hinge in series with every servo joint (same body, same axis)."""
    for joint in _hinges_of(spec):
        if joint.name not in ACTUATOR_NAMES:
            continue
        bl = joint.parent.add_joint()
        bl.name = f"{joint.name}_backlash"
        bl.type = mujoco.mjtJoint.mjJNT_HINGE
        bl.axis = joint.axis
        bl.range = [-BACKLASH_RAD, BACKLASH_RAD]
        bl.limited = mujoco.mjtLimited.mjLIMITED_TRUE
        bl.damping = [0.01, 0.0, 0.0]  # (linear, polynomial terms) in MuJoCo 4
        bl.armature = 0.0005
        bl.frictionloss = 0.0


def _add_toes(spec: mujoco.MjSpec) -> None:
    """A passive, spring-loaded toe hinge at the front of each foot."""
    for side in ("left", "right"):
        foot = spec.body(f"{side}_foot")
        toe = foot.add_body()
        toe.name = f"{side}_toe"
        sole = spec.geom(f"{side}_foot")
        toe.pos = [sole.pos[0] + sole.size[0], 0.0, sole.pos[2]]  # the front edge of the foot
        j = toe.add_joint()
        j.name = f"{side}_toe"
        j.type = mujoco.mjtJoint.mjJNT_HINGE
        j.axis = [0.0, 1.0, 0.0]
        j.range = [-0.6, 0.3]
        j.limited = mujoco.mjtLimited.mjLIMITED_TRUE
        j.stiffness = [0.3, 0.0, 0.0]
        j.damping = [0.01, 0.0, 0.0]
        j.armature = 0.0002
        j.frictionloss = 0.0
        g = toe.add_geom()
        g.name = f"{side}_toe"
        g.type = mujoco.mjtGeom.mjGEOM_BOX
        g.size = [0.01, sole.size[1], sole.size[2]]
        g.pos = [0.01, 0.0, 0.0]
        g.mass = 0.004


@functools.lru_cache(maxsize=None)
def prototype(variant: str = "default") -> mujoco.MjModel:
    """The compiled model of a variant, built once per process. Do not modify it: copy it
    (``copy.copy(model)`` is ``mj_copyModel``), as :func:`load_model` does."""
    check_choice("variant", variant, VARIANTS)
    path = str(asset_path("microduck.xml"))
    if variant == "default":
        return mujoco.MjModel.from_xml_path(path)
    base = mujoco.MjModel.from_xml_path(path)
    spec = mujoco.MjSpec.from_file(path)
    {"backlash": _add_backlash, "toes": _add_toes}[variant](spec)
    # The stand keyframe is written for the default joints; rebuild it by joint name (the
    # variants' extra passive joints stand at 0).
    key = spec.key("stand")
    key_ctrl = list(key.ctrl)
    spec.delete(key)
    unkeyed = spec.compile()
    qpos = unkeyed.qpos0.copy()
    for j in range(base.njnt):
        name = mujoco.mj_id2name(base, mujoco.mjtObj.mjOBJ_JOINT, j)
        n = {0: 7, 1: 4}.get(int(base.jnt_type[j]), 1)
        src, dst = base.jnt_qposadr[j], unkeyed.jnt_qposadr[unkeyed.joint(name).id]
        qpos[dst : dst + n] = base.key_qpos[0, src : src + n]
    key = spec.add_key()
    key.name = "stand"
    key.qpos = qpos
    key.ctrl = key_ctrl
    return spec.compile()


def load_model(variant: str = "default") -> mujoco.MjModel:
    """A private copy of a variant's model."""
    return copy.copy(prototype(variant))


@dataclass(frozen=True)
class RobotIndex:
    """Every name lookup the task needs, resolved once per model (variants move addresses)."""

    nq: int
    nv: int
    nbody: int
    key_id: int
    trunk_id: int
    floor_geom: int
    root_dof: int  # qvel address of the trunk's free joint (linear velocity first)
    act_ids: np.ndarray  # actuator ids in ACTUATOR_NAMES order
    qpos_adr: np.ndarray  # qpos address of each servo joint
    dof_adr: np.ndarray  # qvel address of each servo joint
    stand_qpos: np.ndarray  # (nq,) the stand keyframe
    stand: np.ndarray  # (14,) servo joint angles of the stand keyframe
    lower: np.ndarray  # (14,) joint limits
    upper: np.ndarray
    sensors: Dict[str, slice]  # sensordata slices by name, plus joint_pos/joint_vel/joint_force

    @classmethod
    def of(cls, model: mujoco.MjModel) -> "RobotIndex":
        jid = np.array([model.joint(n).id for n in ACTUATOR_NAMES])
        key_id = model.key("stand").id
        qpos_adr = model.jnt_qposadr[jid].copy()
        root = model.joint("root").id
        sensors = {}
        for s in range(model.nsensor):
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SENSOR, s)
            adr, dim = int(model.sensor_adr[s]), int(model.sensor_dim[s])
            sensors[name] = slice(adr, adr + dim)
        for group, prefix in (
            ("joint_pos", "pos_"),
            ("joint_vel", "vel_"),
            ("joint_force", "frc_"),
        ):
            first = sensors[prefix + ACTUATOR_NAMES[0]].start
            expected = [slice(first + k, first + k + 1) for k in range(NUM_ACTIONS)]
            if [sensors[prefix + n] for n in ACTUATOR_NAMES] != expected:
                raise ValueError(f"the {prefix}* sensors must be contiguous in actuator order")
            sensors[group] = slice(first, first + NUM_ACTIONS)
        stand_qpos = model.key_qpos[key_id].copy()
        return cls(
            nq=model.nq,
            nv=model.nv,
            nbody=model.nbody,
            key_id=key_id,
            trunk_id=model.body("trunk").id,
            floor_geom=model.geom("floor").id,
            root_dof=int(model.jnt_dofadr[root]),
            act_ids=np.array([model.actuator(n).id for n in ACTUATOR_NAMES]),
            qpos_adr=qpos_adr,
            dof_adr=model.jnt_dofadr[jid].copy(),
            stand_qpos=stand_qpos,
            stand=stand_qpos[qpos_adr].copy(),
            lower=model.jnt_range[jid, 0].copy(),
            upper=model.jnt_range[jid, 1].copy(),
            sensors=sensors,
        )


@functools.lru_cache(maxsize=None)
def robot_index(variant: str = "default") -> RobotIndex:
    return RobotIndex.of(prototype(variant))


# ---------------------------------------------------------------------------------------------
# Domain randomisation: one episode's physics, written into a model and restored exactly
# ---------------------------------------------------------------------------------------------


@dataclass
class DomainParams:
    """Physics of one episode under domain randomisation (absolute servo values, scale factors)."""

    kp: float
    damping: float
    frictionloss: float
    armature: float
    force_limit: float
    mass_scale: np.ndarray  # (nbody,) factor on each body's mass and inertia (world: 1.0)
    friction_scale: float  # factor on the floor's sliding friction


def apply_physics_params(
    model: mujoco.MjModel,
    nominal: Dict[str, np.ndarray],
    robot: RobotIndex,
    domain: Optional[DomainParams],
) -> None:
    """Restore the nominal fields, then (if ``domain``) write this episode's values.

    Values are always computed from the saved nominal arrays, never from the model's current
    ones, so nothing compounds across episodes; with ``domain=None`` the model is restored
    byte for byte. Derived constants (``mj_setConst``) are deliberately not recomputed.
    """
    for name, value in nominal.items():
        getattr(model, name)[:] = value
    if domain is None:
        return
    a, dof = robot.act_ids, robot.dof_adr
    model.actuator_gainprm[a, 0] = domain.kp
    model.actuator_biasprm[a, 1] = -domain.kp
    model.actuator_forcerange[a, 0] = -domain.force_limit
    model.actuator_forcerange[a, 1] = domain.force_limit
    model.dof_damping[dof] = domain.damping
    model.dof_frictionloss[dof] = domain.frictionloss
    model.dof_armature[dof] = domain.armature
    model.body_mass[:] = nominal["body_mass"] * domain.mass_scale
    model.body_inertia[:] = nominal["body_inertia"] * domain.mass_scale[:, None]
    model.geom_friction[robot.floor_geom, 0] = (
        nominal["geom_friction"][robot.floor_geom, 0] * domain.friction_scale
    )


def projected_gravity(quat: np.ndarray) -> Tuple[float, float, float]:
    """Gravity direction (0, 0, -1) in the frame of the unit quaternion (w, x, y, z) given
    unnormalised: it is normalised first."""
    w, x, y, z = quat
    norm = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    return (
        -(2.0 * (x * z - w * y)),
        -(2.0 * (y * z + w * x)),
        -(1.0 - 2.0 * (x * x + y * y)),
    )
