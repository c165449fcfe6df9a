"""Microduck balance: the robot model, the episode draw, and the reference single env.

The reference env (:class:`MicroduckBalanceEnv`, ``gymnasium.make("raylab/MicroduckBalance-v0")``)
is the specification of the task, written for clarity: one robot, one ``MjData``, plain NumPy. The
batched env in :mod:`raylab.envs.tasks.microduck_balance_vec` must equal it bit for bit given the
same :class:`EpisodeParams` and the same actions (see :mod:`raylab.envs.contract`).

What is shared between the two (written once, here): building the model and its variants, the
name lookups (:class:`RobotIndex`), the options check, the episode draw
(:func:`draw_episode_params`) and writing an episode's physics parameters into a model
(:func:`apply_physics_params`). What is written twice and compared: the reset and step logic,
latency, pushes, sensor noise, the observation and the rewards.

One control step (50 Hz) of the reference env:

1. check the action (shape (14,), finite); clip it to [-1, 1], counting clipped entries;
2. latency: the servos get the action from ``latency`` control steps ago (zeros before that);
3. ctrl = clip(stand + action_scale * delayed action, joint limits);
4. if a push is scheduled at this step, add its (vx, vy) to the trunk's linear velocity;
5. ``mj_step(m, d, 10)`` then ``mj_forward(m, d)``: every observation channel is evaluated on
   the post-step state (one timestamp);
6. observation (48 float32): joint position - stand (14), joint velocity x 0.05 (14), the
   action just taken (14), gyro x 0.25 (3), gravity in the trunk frame (3); the scale table is
   float32 and multiplies the float64 raw values; with sensor noise, gyro and the orientation
   quaternion get Gaussian noise from the episode's own noise stream;
7. reward: weighted sum of the version's terms (v1 or v2), in table order; terms in ``info``;
8. fixed-length episodes: ``truncated`` after ``episode_steps`` steps, never ``terminated``.
"""

from __future__ import annotations

import collections
import copy
import functools
import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import gymnasium as gym
import mujoco
import numpy as np

from raylab.envs import asset_path
from raylab.envs.core.managers import RewardTerm
from raylab.envs.core.options import parse_options
from raylab.envs.core.vec_env import check_choice, nominal_physics
from raylab.envs.tasks import BatchedEnvConfig, option

# ---------------------------------------------------------------------------------------------
# Constants of the task
# ---------------------------------------------------------------------------------------------

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
OBS_DIM = 48
# privileged_obs: the critic-only entries after the 48: trunk-frame linear velocity (m/s, the
# velocimeter at the IMU) and trunk height (m, the IMU site's z).
PRIVILEGED_DIM = 4
MAX_OBS_HISTORY = 8  # obs_history: at most 8 previous observations (0.16 s)
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
PUSH_MARGIN_STEPS = 25  # pushes land at least 0.5 s from either end of the episode
MAX_LATENCY = 2  # control steps
MAX_PUSH_SCALE = 3.0  # a training push curriculum's factor: 0..3 times the task's speeds
BACKLASH_RAD = 0.002  # free play of the backlash variant's passive hinges (see docs/envs.md)

VARIANTS = ("default", "backlash", "toes")
REWARD_VERSIONS = ("v1", "v2")

# Observation scale table, float32 like the original task's constants. Multiplying the float64
# raw values by it promotes each constant (0.05 becomes 0.05000000074505806).
OBS_SCALE = np.concatenate(
    [
        np.full(NUM_ACTIONS, 1.0, dtype=np.float32),  # joint position - stand
        np.full(NUM_ACTIONS, 0.05, dtype=np.float32),  # joint velocity
        np.full(NUM_ACTIONS, 1.0, dtype=np.float32),  # action just taken
        np.full(3, 0.25, dtype=np.float32),  # gyro
        np.full(3, 1.0, dtype=np.float32),  # projected gravity
    ]
)

HEIGHT_SIGMA = 0.03  # v1 height reward: Gaussian around STAND_HEIGHT
GYRO_NOISE_STD = 0.005  # rad/s, when sensor noise is on
QUAT_NOISE_STD = 0.001  # per quaternion component, when sensor noise is on

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

# ---------------------------------------------------------------------------------------------
# Rewards: each term once, with its weight, per reward version (summed in table order)
# ---------------------------------------------------------------------------------------------
# A term function reads the batched env's state arrays (one row per env) and returns one raw
# value per env; the batched env multiplies by the weight. The reference env below computes the
# same raw values for its one robot (written separately, compared bit for bit) and takes the
# weights from this table.


def _mean_square(x: np.ndarray) -> np.ndarray:
    """Row mean of x*x: a C-contiguous (N, k) array reduced along its last axis (same pairwise
    summation as the reference's 1-D mean)."""
    return np.mean(np.ascontiguousarray(x * x), axis=1)


def upright(env):
    """Cosine of the trunk's tilt, floored at 0."""
    return np.maximum(0.0, env.upright_cos)


def height_gaussian(env):
    """v1: Gaussian of the trunk height around the stand height (sigma HEIGHT_SIGMA)."""
    e = (env.trunk_height - STAND_HEIGHT) / HEIGHT_SIGMA
    return np.exp(-0.5 * e * e)


def height_linear(env):
    """v2: trunk height over the stand height, clipped to [0, 1]."""
    return np.clip(env.trunk_height / STAND_HEIGHT, 0.0, 1.0)


def posture(env):
    """Mean square distance of the joints from the stand pose."""
    return _mean_square(env.joint_pos - env.stand)


def action_rate(env):
    """Mean square change of the action since the last step."""
    return _mean_square(env.action - env.prev_action)


def joint_vel_sq(env):
    """Mean square joint velocity."""
    return _mean_square(env.joint_vel)


def effort(env):
    """Mean square actuator force."""
    return _mean_square(env.joint_force)


REWARDS: Dict[str, Tuple[RewardTerm, ...]] = {
    "v1": (
        RewardTerm("upright", upright, weight=1.0),
        RewardTerm("height", height_gaussian, weight=1.0),
        RewardTerm("posture", posture, weight=-0.10),
        RewardTerm("action_rate", action_rate, weight=-0.05),
        RewardTerm("joint_vel", joint_vel_sq, weight=-2e-4),
        RewardTerm("effort", effort, weight=-0.02),
    ),
    "v2": (
        RewardTerm("upright", upright, weight=1.0),
        RewardTerm("height", height_linear, weight=1.0),
        RewardTerm("action_rate", action_rate, weight=-0.05),
        RewardTerm("joint_vel", joint_vel_sq, weight=-4.2e-2),
    ),
}


def is_fallen(trunk_height, upright_cos):
    """Whether the duck is down (scalars or arrays): the one survival definition of the task,
    used by both envs' ``info["fallen"]``, their episode statistics, ``raylab eval`` and the
    baselines."""
    return (trunk_height < SURVIVAL_MIN_HEIGHT) | (upright_cos < SURVIVAL_MIN_UPRIGHT)


# ---------------------------------------------------------------------------------------------
# Options: MicroduckBalanceConfig
# ---------------------------------------------------------------------------------------------


@dataclass
class MicroduckBalanceConfig(BatchedEnvConfig):
    """The options of microduck_balance (both envs; ``env.*`` in a raylab config)."""

    reward_version: str = option("v2", "reward definition", ("v1", "v2"))
    variant: str = option(
        "default", "physics variant of the robot", ("default", "backlash", "toes")
    )
    episode_steps: int = option(250, "control steps per episode (50 Hz); every end is a truncation")
    action_scale: float = option(0.35, "target = stand pose + action_scale * action")
    num_pushes: int = option(3, "pushes per episode")
    push_vel_min: float = option(
        0.15, "smallest push (m/s added to the trunk's horizontal velocity)"
    )
    push_vel_max: float = option(0.45, "largest push (m/s)")
    init_noise: float = option(0.02, "uniform initial joint noise (rad), clamped to joint limits")
    latency_steps: int = option(0, "action latency in control steps (0-2)")
    sensor_noise: bool = option(False, "Gaussian noise on gyro and orientation")
    domain_randomization: bool = option(False, "randomise servos, masses, friction, latency, noise")
    privileged_obs: bool = option(
        False,
        "append privileged state (trunk-frame velocity, trunk height) after the 48 observation "
        "entries: the PPO / APPO critic sees it, the policy does not (asymmetric critic)",
    )
    obs_history: int = option(
        0,
        "the policy also sees its previous k observations (48 entries each, newest first, "
        "after the current 48 and before any privileged entries); a push shows in how the "
        "gyro, gravity and joints move from step to step; 0-8",
    )
    # Training-only options: the episodes the policy learns from, never the evaluated task.
    fall_termination: bool = option(
        False,
        "training only: end an episode (terminated, no bootstrap) on the step the duck is down "
        "(is_fallen), so a fall costs every reward it would still have earned; evaluation "
        "always runs the task's fixed-length episodes",
        training_only=True,
    )
    push_curriculum_steps: int = option(
        0,
        "training only: push speeds are scaled by a factor that goes linearly from "
        "push_scale_start to push_scale_end over this many env steps of each vector env "
        "(per EnvRunner: with R EnvRunners the ramp ends after about R times as many steps in "
        "all); 0: no ramp, the factor is push_scale_end throughout",
        training_only=True,
    )
    push_scale_start: float = option(
        0.0, "training only: push-speed factor at the start of the curriculum", training_only=True
    )
    push_scale_end: float = option(
        1.0,
        "training only: push-speed factor at the end of the curriculum (above 1: pushes "
        "stronger than the task's, for robustness late in training)",
        training_only=True,
    )


def check_balance_options(o) -> None:
    """The value checks of the balance options (``MicroduckBalanceConfig``, filled by
    :func:`balance_options`); each raises one line naming the value and the valid range."""
    if int(o.episode_steps) < 1:
        raise ValueError(f"episode_steps={o.episode_steps} is invalid; it must be >= 1")
    if not (0 <= int(o.obs_history) <= MAX_OBS_HISTORY):
        raise ValueError(
            f"obs_history={o.obs_history} is invalid; valid range: 0..{MAX_OBS_HISTORY}"
        )
    if not (0 <= int(o.latency_steps) <= MAX_LATENCY):
        raise ValueError(
            f"latency_steps={o.latency_steps} is invalid; valid range: 0..{MAX_LATENCY}"
        )
    if int(o.push_curriculum_steps) < 0:
        raise ValueError(
            f"push_curriculum_steps={o.push_curriculum_steps} is invalid; it must be >= 0"
        )
    for name in ("push_scale_start", "push_scale_end"):
        v = float(getattr(o, name))
        if not (math.isfinite(v) and 0 <= v <= MAX_PUSH_SCALE):
            raise ValueError(f"{name}={v} is invalid; valid range: 0..{MAX_PUSH_SCALE}")
    for name in ("action_scale", "push_vel_min", "push_vel_max", "init_noise"):
        v = float(getattr(o, name))
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}={v} is invalid; it must be finite and >= 0")
    if o.push_vel_min > o.push_vel_max:
        raise ValueError(f"push_vel_min={o.push_vel_min} is above push_vel_max={o.push_vel_max}")
    n_slots = len(push_slots(int(o.episode_steps)))
    if not (0 <= int(o.num_pushes) <= n_slots):
        raise ValueError(
            f"num_pushes={o.num_pushes} does not fit: pushes land on distinct control "
            f"steps at least {PUSH_MARGIN_STEPS} steps from either end, {n_slots} such "
            f"steps in an episode of {o.episode_steps}"
        )


def balance_options(options: Dict[str, Any]) -> MicroduckBalanceConfig:
    """The balance task's options from keyword options (both envs), checked."""
    return parse_options(MicroduckBalanceConfig, options, check_balance_options)


def push_scale(o: MicroduckBalanceConfig, env_steps: int) -> float:
    """The training push-speed factor after ``env_steps`` steps of one env (or vector env):
    linear from ``push_scale_start`` to ``push_scale_end`` over ``push_curriculum_steps``, then
    ``push_scale_end``; 1.0 with the task's own options (and in evaluation)."""
    end = float(o.push_scale_end)
    if int(o.push_curriculum_steps) <= 0:
        return end
    start = float(o.push_scale_start)
    return start + (end - start) * min(1.0, env_steps / int(o.push_curriculum_steps))


def push_slots(episode_steps: int) -> np.ndarray:
    """Control steps a push may land on: at least 0.5 s from the start and from the end."""
    return np.arange(PUSH_MARGIN_STEPS, episode_steps - PUSH_MARGIN_STEPS + 1)


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
# Episode parameters: everything an episode draws
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


@dataclass
class EpisodeParams:
    """Everything an episode draws. ``reset()`` returns it in ``info["episode_params"]``;
    ``reset(options={"episode_params": p})`` replays it instead of drawing."""

    qpos: np.ndarray  # (nq,) initial positions: the stand keyframe plus clamped joint noise
    qvel: np.ndarray  # (nv,) initial velocities (zeros)
    push_steps: np.ndarray  # (P,) int64, distinct control steps at which a push lands
    push_vel: np.ndarray  # (P, 2) m/s added to the trunk's (vx, vy)
    latency: int  # control steps between an action and the servos receiving it
    init_noise: float  # half-width of the uniform joint noise that was used (rad)
    sensor_noise: bool  # Gaussian noise on gyro and orientation
    noise_seed: int  # seeds this episode's sensor-noise stream
    domain: Optional[DomainParams] = None  # None: nominal physics

    def copy(self) -> "EpisodeParams":
        return copy.deepcopy(self)

    def to_dict(self) -> Dict[str, Any]:
        def plain(v):
            return v.tolist() if isinstance(v, np.ndarray) else v

        out = {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name != "domain"}
        out["domain"] = (
            None
            if self.domain is None
            else {f.name: plain(getattr(self.domain, f.name)) for f in fields(self.domain)}
        )
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "EpisodeParams":
        dom = d.get("domain")
        return cls(
            qpos=np.asarray(d["qpos"], dtype=np.float64),
            qvel=np.asarray(d["qvel"], dtype=np.float64),
            push_steps=np.asarray(d["push_steps"], dtype=np.int64),
            push_vel=np.asarray(d["push_vel"], dtype=np.float64).reshape(-1, 2),
            latency=int(d["latency"]),
            init_noise=float(d["init_noise"]),
            sensor_noise=bool(d["sensor_noise"]),
            noise_seed=int(d["noise_seed"]),
            domain=None
            if dom is None
            else DomainParams(
                **{**dom, "mass_scale": np.asarray(dom["mass_scale"], dtype=np.float64)}
            ),
        )


def draw_episode_params(
    rng: np.random.Generator,
    opts: MicroduckBalanceConfig,
    robot: RobotIndex,
    push_factor: float = 1.0,
) -> EpisodeParams:
    """Draw one episode. The order of draws is part of the contract (same seed, same episode):

    domain randomisation (if on): 5 servo values, mass scales, floor friction, latency, noise
    width; then the joint noise (if its width > 0), push steps, push speeds, push angles, and
    the sensor-noise seed. ``push_factor`` (a training push curriculum, :func:`push_scale`)
    multiplies the drawn speeds and changes no draw.
    """
    domain = None
    latency, init_noise, sensor_noise = opts.latency_steps, opts.init_noise, opts.sensor_noise
    if opts.domain_randomization:
        servo = {k: float(rng.uniform(min(v), max(v))) for k, v in SERVO_FITS.items()}
        mass_scale = np.ones(robot.nbody)
        mass_scale[1:] = rng.uniform(*MASS_SCALE_RANGE, size=robot.nbody - 1)
        friction_scale = float(rng.uniform(*FRICTION_SCALE_RANGE))
        domain = DomainParams(**servo, mass_scale=mass_scale, friction_scale=friction_scale)
        latency = int(rng.integers(DR_LATENCY_RANGE[0], DR_LATENCY_RANGE[1] + 1))
        init_noise = float(rng.uniform(*DR_INIT_NOISE_RANGE))
        sensor_noise = True

    qpos = robot.stand_qpos.copy()
    if init_noise > 0:
        noise = rng.uniform(-init_noise, init_noise, size=NUM_ACTIONS)
        qpos[robot.qpos_adr] = np.clip(robot.stand + noise, robot.lower, robot.upper)

    n = opts.num_pushes
    push_steps = rng.choice(push_slots(opts.episode_steps), size=n, replace=False).astype(np.int64)
    speed = rng.uniform(opts.push_vel_min, opts.push_vel_max, size=n) * push_factor
    angle = rng.uniform(0.0, 2.0 * np.pi, size=n)
    push_vel = np.stack([speed * np.cos(angle), speed * np.sin(angle)], axis=1).reshape(n, 2)
    noise_seed = int(rng.integers(0, 2**63 - 1))
    return EpisodeParams(
        qpos=qpos,
        qvel=np.zeros(robot.nv),
        push_steps=push_steps,
        push_vel=push_vel,
        latency=int(latency),
        init_noise=float(init_noise),
        sensor_noise=bool(sensor_noise),
        noise_seed=noise_seed,
        domain=domain,
    )


def check_episode_params(p: Any, robot: RobotIndex, episode_steps: int) -> EpisodeParams:
    """Validate replayed parameters (a dict from ``to_dict`` is accepted) and return a copy."""
    if isinstance(p, dict):
        p = EpisodeParams.from_dict(p)
    if not isinstance(p, EpisodeParams):
        raise TypeError(
            f"episode_params must be an EpisodeParams or its dict, got {type(p).__name__}"
        )
    p = p.copy()
    if p.qpos.shape != (robot.nq,) or p.qvel.shape != (robot.nv,):
        raise ValueError(
            f"episode_params qpos/qvel have shapes {p.qpos.shape}/{p.qvel.shape}; this model "
            f"variant needs ({robot.nq},)/({robot.nv},)"
        )
    if not (np.all(np.isfinite(p.qpos)) and np.all(np.isfinite(p.qvel))):
        raise ValueError("episode_params qpos/qvel contain NaN or Inf")
    p.push_steps = np.asarray(p.push_steps, dtype=np.int64).reshape(-1)
    p.push_vel = np.asarray(p.push_vel, dtype=np.float64).reshape(-1, 2)
    if len(p.push_steps) != len(p.push_vel) or len(set(p.push_steps.tolist())) != len(p.push_steps):
        raise ValueError("episode_params push_steps must be distinct, one per push_vel row")
    if not (0 <= p.latency <= MAX_LATENCY):
        raise ValueError(f"episode_params latency={p.latency}; valid range: 0..{MAX_LATENCY}")
    if p.domain is not None and np.shape(p.domain.mass_scale) != (robot.nbody,):
        raise ValueError(
            f"episode_params domain.mass_scale has shape {np.shape(p.domain.mass_scale)}; "
            f"this model variant needs ({robot.nbody},)"
        )
    return p


# ---------------------------------------------------------------------------------------------
# Writing an episode's physics into a model (and restoring it exactly)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The reference environment
# ---------------------------------------------------------------------------------------------


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
        self.reward_version = self.opts.reward_version
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
        h = self._trunk_height()
        q = self.data.qpos[self.robot.qpos_adr]
        qd = self.data.qvel[self.robot.dof_adr]
        tau = self.data.actuator_force[self.robot.act_ids]
        dq = q - self.robot.stand
        da = action - prev_action
        raw = {"upright": max(0.0, self._upright_cos())}
        if self.reward_version == "v1":
            e = (h - STAND_HEIGHT) / HEIGHT_SIGMA
            raw["height"] = float(np.exp(-0.5 * e * e))
            raw["posture"] = float(np.mean(dq * dq))
            raw["action_rate"] = float(np.mean(da * da))
            raw["joint_vel"] = float(np.mean(qd * qd))
            raw["effort"] = float(np.mean(tau * tau))
        else:
            raw["height"] = min(max(h / STAND_HEIGHT, 0.0), 1.0)
            raw["action_rate"] = float(np.mean(da * da))
            raw["joint_vel"] = float(np.mean(qd * qd))
        reward = 0.0
        terms = {}
        for term in REWARDS[self.reward_version]:
            terms[term.name] = term.weight * raw[term.name]
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
