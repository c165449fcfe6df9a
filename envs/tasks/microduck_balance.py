"""Microduck balance: a 14-servo duck that must keep standing under pushes. The task, in one module.

Everything a reader or an editor of the task needs is here, top to bottom: its constants, its
reward terms and their weights (the ``rew_<term>`` options), its options dataclass
(``env.*`` in a raylab config), the episode draw (:class:`EpisodeParams`: initial state,
pushes, latency, noise, domain randomisation), its observation, termination and event tables,
and the batched env :class:`MicroduckBalanceVecEnv` that runs them on
:class:`~raylab.envs.core.vec_env.BatchedVecEnv`. The robot (model, variants, name lookups,
survival, domain-randomisation physics) is :mod:`raylab.envs.robots.microduck`; generic terms
are :mod:`raylab.envs.core.terms`.

``gymnasium.make_vec("raylab/MicroduckBalance-v0", num_envs=N,
vectorization_mode="vector_entry_point", num_threads=T, **options)`` builds the batched env;
``gymnasium.make("raylab/MicroduckBalance-v0")`` the reference env
(:mod:`raylab.envs.reference.microduck_balance`), the task's specification written for one
robot in plain NumPy, which the batched env equals bit for bit given the same episode draws and
actions (:mod:`raylab.envs.contract`). Both compute the reward from the term functions below.

One control step (50 Hz):

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
7. reward: weighted sum of the reward table's terms, in table order; terms in ``info``;
8. fixed-length episodes: ``truncated`` after ``episode_steps`` steps, never ``terminated``
   (``fall_termination``, training only, ends an episode on a fall).

Env state of the batched env is plain arrays, one row per env (``joint_pos``, ``joint_vel``,
``action``, ``prev_action``, ``step_count``, ...); every term function reads them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from raylab.envs.core.managers import (
    EventTerm,
    ObsTerm,
    RewardTerm,
    TerminationTerm,
    reward_table,
)
from raylab.envs.core.options import parse_options
from raylab.envs.core.terms import (
    mean_square,
    obs_action,
    obs_base_height,
    obs_base_lin_vel,
    obs_joint_vel,
    time_out,
    upright,
)
from raylab.envs.core.vec_env import BatchedVecEnv, gravity_from_quat
from raylab.envs.robots.microduck import (
    DR_INIT_NOISE_RANGE,
    DR_LATENCY_RANGE,
    FRICTION_SCALE_RANGE,
    MASS_SCALE_RANGE,
    MAX_LATENCY,
    N_SUBSTEPS,
    NUM_ACTIONS,
    SERVO_FITS,
    STAND_HEIGHT,
    DomainParams,
    RobotIndex,
    apply_physics_params,
    is_fallen,
    prototype,
    robot_index,
)
from raylab.envs.tasks import BatchedEnvConfig, PushCurriculum, option

# ---------------------------------------------------------------------------------------------
# Constants of the task
# ---------------------------------------------------------------------------------------------

OBS_DIM = 48
# privileged_obs: the critic-only entries after the 48: trunk-frame linear velocity (m/s, the
# velocimeter at the IMU) and trunk height (m, the IMU site's z).
PRIVILEGED_DIM = 4
MAX_OBS_HISTORY = 8  # obs_history: at most 8 previous observations (0.16 s)
PUSH_MARGIN_STEPS = 25  # pushes land at least 0.5 s from either end of the episode

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

# ---------------------------------------------------------------------------------------------
# Rewards: each term once; its weight is the option rew_<term>
# ---------------------------------------------------------------------------------------------
# A term function reads the env's state arrays (one row per env) and returns one raw value per
# env; the env adds weight x raw in table order. The reference env calls the same functions on
# its one robot's state.


def height_gaussian(env):
    """v1: Gaussian of the trunk height around the stand height (sigma HEIGHT_SIGMA)."""
    e = (env.trunk_height - STAND_HEIGHT) / HEIGHT_SIGMA
    return np.exp(-0.5 * e * e)


def height_linear(env):
    """v2: trunk height over the stand height, clipped to [0, 1]."""
    return np.clip(env.trunk_height / STAND_HEIGHT, 0.0, 1.0)


def posture(env):
    """Mean square distance of the joints from the stand pose."""
    return mean_square(env.joint_pos - env.stand)


def action_rate(env):
    """Mean square change of the action since the last step."""
    return mean_square(env.action - env.prev_action)


def joint_vel_sq(env):
    """Mean square joint velocity."""
    return mean_square(env.joint_vel)


def effort(env):
    """Mean square actuator force."""
    return mean_square(env.joint_force)


# Every reward term of the task, in the order the reward adds them (v2's height term; v1
# swaps in its Gaussian, REWARD_VERSIONS).
REWARD_TERMS = {
    "upright": upright,
    "height": height_linear,
    "posture": posture,
    "action_rate": action_rate,
    "joint_vel": joint_vel_sq,
    "effort": effort,
}


@dataclass(frozen=True)
class RewardVersion:
    """A reward definition: the weight of each term (absent: 0) and the term functions it
    swaps in."""

    weights: Dict[str, float]
    terms: Dict[str, Any]


REWARD_VERSIONS: Dict[str, RewardVersion] = {
    "v1": RewardVersion(
        weights={
            "upright": 1.0,
            "height": 1.0,
            "posture": -0.10,
            "action_rate": -0.05,
            "joint_vel": -2e-4,
            "effort": -0.02,
        },
        terms={"height": height_gaussian},
    ),
    "v2": RewardVersion(
        weights={"upright": 1.0, "height": 1.0, "action_rate": -0.05, "joint_vel": -4.2e-2},
        terms={},
    ),
}


def rewards(opts) -> Tuple[RewardTerm, ...]:
    """The reward table of these options: the version's terms and weights, each weight replaced
    by its option ``rew_<term>`` where that is set; zero weights are left out."""
    version = REWARD_VERSIONS[opts.reward_version]
    return reward_table({**REWARD_TERMS, **version.terms}, opts, version.weights)


def _weight(term: str, help: str):
    return option(
        None,
        f"reward weight: {help}; null: the reward version's (v1 "
        f"{REWARD_VERSIONS['v1'].weights.get(term, 0.0):g}, v2 "
        f"{REWARD_VERSIONS['v2'].weights.get(term, 0.0):g})",
    )


# ---------------------------------------------------------------------------------------------
# Options: MicroduckBalanceConfig
# ---------------------------------------------------------------------------------------------


@dataclass
class MicroduckBalanceConfig(PushCurriculum, BatchedEnvConfig):
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
    rew_upright: Optional[float] = _weight("upright", "max(0, cosine of the trunk's tilt)")
    rew_height: Optional[float] = _weight(
        "height", "trunk height (v1: Gaussian around the stand height; v2: height / stand, 0-1)"
    )
    rew_posture: Optional[float] = _weight("posture", "mean square joint distance from stand")
    rew_action_rate: Optional[float] = _weight("action_rate", "mean square action change")
    rew_joint_vel: Optional[float] = _weight("joint_vel", "mean square joint velocity")
    rew_effort: Optional[float] = _weight("effort", "mean square actuator force")
    # Training-only options: the episodes the policy learns from, never the evaluated task.
    fall_termination: bool = option(
        False,
        "training only: end an episode (terminated, no bootstrap) on the step the duck is down "
        "(is_fallen), so a fall costs every reward it would still have earned; evaluation "
        "always runs the task's fixed-length episodes",
        training_only=True,
    )

    def check(self) -> None:
        check_balance_options(self)


def check_balance_options(o) -> None:
    """The value checks of the balance options (``MicroduckBalanceConfig``, filled by
    :func:`balance_options`); each raises one line naming the value and the valid range."""
    if int(o.episode_steps) < 1:
        raise ValueError(f"episode_steps={o.episode_steps} is invalid; it must be >= 1")
    for f in fields(o):
        v = getattr(o, f.name)
        if f.name.startswith("rew_") and v is not None and not math.isfinite(float(v)):
            raise ValueError(f"{f.name}={v} is invalid; a reward weight must be finite")
    if not (0 <= int(o.obs_history) <= MAX_OBS_HISTORY):
        raise ValueError(
            f"obs_history={o.obs_history} is invalid; valid range: 0..{MAX_OBS_HISTORY}"
        )
    if not (0 <= int(o.latency_steps) <= MAX_LATENCY):
        raise ValueError(
            f"latency_steps={o.latency_steps} is invalid; valid range: 0..{MAX_LATENCY}"
        )
    o.check_push_curriculum()
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
    return parse_options(MicroduckBalanceConfig, options)


def push_scale(o: MicroduckBalanceConfig, env_steps: int) -> float:
    """The training push-speed factor after ``env_steps`` steps of one env (or vector env)
    (:meth:`~raylab.envs.tasks.PushCurriculum.push_scale`); 1.0 with the task's own options
    (and in evaluation)."""
    return o.push_scale(env_steps)


def push_slots(episode_steps: int) -> np.ndarray:
    """Control steps a push may land on: at least 0.5 s from the start and from the end."""
    return np.arange(PUSH_MARGIN_STEPS, episode_steps - PUSH_MARGIN_STEPS + 1)


# ---------------------------------------------------------------------------------------------
# Episode parameters: everything an episode draws
# ---------------------------------------------------------------------------------------------


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
# Observation, termination and event terms: f(env) -> one value (or one row) per env
# ---------------------------------------------------------------------------------------------


# observation terms
def obs_joint_pos(env):
    return env.joint_pos - env.stand


def obs_gyro(env):
    return env.obs_gyro


def obs_gravity(env):
    return env.obs_gravity


# termination terms (time_out: raylab.envs.core.terms)
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


# privileged_obs: critic-only entries after the policy's observation (PRIVILEGED_DIM).
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
            rewards(self.opts),
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
        of steps not fallen, :func:`~raylab.envs.robots.microduck.is_fallen`) and mean trunk
        height (m); then clear them."""
        f = self._finished
        n = f["episodes"]
        out = {"episodes": n}
        if n:
            out["survival"] = f["survival"] / n
            out["trunk_height"] = f["trunk_height"] / n
        self._finished = {"episodes": 0, "survival": 0.0, "trunk_height": 0.0}
        return out
