"""The task table: names, Gymnasium ids, typed env options and per-algorithm defaults.

This module is light (no MuJoCo import) so the CLI can compose and print configs quickly.
Each task's environment code lives in its own module and is registered with Gymnasium by
``raylab.envs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from omegaconf import MISSING


def _f(default: Any = MISSING, help: str = "", choices: Tuple[str, ...] = (), factory=None):
    """A config dataclass field with its help text and, for strings, its valid choices."""
    meta = {"help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# Options that configure the vector env rather than the task; the single (reference) envs accept
# and ignore them, so that one env_config serves both.
VECTOR_ONLY_OPTIONS = ("num_threads", "allow_overcommit", "autoreset_mode", "info_mode")
# Fields of EnvConfig that are raylab plumbing, not constructor options of an env.
PLUMBING_FIELDS = ("gym_id", "num_envs", "kwargs")


@dataclass
class EnvConfig:
    """Options every task has. Any Gymnasium id uses exactly these."""

    gym_id: str = _f(MISSING, "Gymnasium id the task is registered under (set by --task)")
    num_envs: int = _f(
        16,
        "envs stepped by each EnvRunner (one vector env); the robot tasks set their own in the "
        "task table: 32 for PPO / APPO, 8 for SAC",
    )
    num_threads: str = _f(
        "auto",
        "physics threads per EnvRunner (raylab tasks only): a number, or auto = the CPUs the "
        "EnvRunner may use (on a cluster its reservation, resources.num_cpus_per_env_runner; "
        "with an in-process Ray the machine's cores shared among the EnvRunners, less the "
        "Learners' for SAC, whose learner never waits); results do not depend on it",
    )
    kwargs: Dict[str, Any] = _f(help="extra keyword arguments for gymnasium.make", factory=dict)


@dataclass
class MicroduckBalanceConfig(EnvConfig):
    reward_version: str = _f("v2", "reward definition", ("v1", "v2"))
    variant: str = _f("default", "physics variant of the robot", ("default", "backlash", "toes"))
    episode_steps: int = _f(250, "control steps per episode (50 Hz); every end is a truncation")
    action_scale: float = _f(0.35, "target = stand pose + action_scale * action")
    num_pushes: int = _f(3, "pushes per episode")
    push_vel_min: float = _f(0.15, "smallest push (m/s added to the trunk's horizontal velocity)")
    push_vel_max: float = _f(0.45, "largest push (m/s)")
    init_noise: float = _f(0.02, "uniform initial joint noise (rad), clamped to joint limits")
    latency_steps: int = _f(0, "action latency in control steps (0-2)")
    sensor_noise: bool = _f(False, "Gaussian noise on gyro and orientation")
    domain_randomization: bool = _f(False, "randomise servos, masses, friction, latency, noise")
    privileged_obs: bool = _f(
        False,
        "append privileged state (trunk-frame velocity, trunk height) after the 48 observation "
        "entries: the PPO / APPO critic sees it, the policy does not (asymmetric critic)",
    )
    autoreset_mode: str = _f("next_step", "vector autoreset", ("next_step", "same_step"))
    info_mode: str = _f(
        "none",
        "vector env infos: none = {} (RLlib-safe; reward/termination stats via pop_log), "
        "full = per-env arrays plus infos['log']",
        ("none", "full"),
    )
    allow_overcommit: bool = _f(False, "allow num_threads above 8 or above the machine's cores")


def _range(low: float, high: float, help: str):
    return _f(help=help, factory=lambda: [low, high])


@dataclass
class JoystickConfig(EnvConfig):
    """Options shared by the joystick tasks; the defaults are the Go2's (see
    envs/tasks/legged_joystick.py).

    Reward weights are the ``rew_<term>`` fields: one per term of
    ``raylab.envs.tasks.legged_joystick.REWARD_TERMS``; weight 0 leaves the term out (it is
    neither computed nor logged). Penalties take negative weights. The learner's reward is
    0.02 s x the weighted sum.
    """

    episode_steps: int = _f(1000, "control steps per episode (50 Hz); reaching it truncates")
    action_scale: float = _f(0.25, "servo target = default pose + action_scale * action (rad)")
    lin_vel_x: List[float] = _range(-1.0, 1.0, "forward velocity command range (m/s)")
    lin_vel_y: List[float] = _range(-0.5, 0.5, "sideways velocity command range (m/s)")
    ang_vel_yaw: List[float] = _range(-1.0, 1.0, "yaw rate command range (rad/s)")
    command_resample_s: List[float] = _range(
        4.0, 8.0, "a new command after a time drawn uniformly from this range (s)"
    )
    command_zero_prob: float = _f(0.1, "share of commands that are zero (stand still)")
    gait_freq_hz: float = _f(
        2.0, "gait clock frequency (Hz); 0 turns the clock and its foot-phase observation off"
    )
    swing_height: float = _f(0.08, "apex height of a swing (m): feet_swing_height, foot_clearance")
    tracking_sigma_lin: float = _f(0.25, "tracking_lin_vel = exp(-|v_xy error|^2 / this)")
    tracking_sigma_ang: float = _f(0.25, "tracking_ang_vel = exp(-yaw rate error^2 / this)")
    base_height_target: float = _f(0.30, "trunk height (m) the base_height penalty aims at")
    air_time_min_s: float = _f(0.1, "feet_air_time pays air time above this (s)")
    air_time_max_s: float = _f(0.5, "... up to this (s)")
    init_noise: float = _f(0.05, "uniform initial joint noise (rad), clamped to joint limits")
    push_vel: float = _f(0.0, "push: uniform +/- this (m/s) added to the trunk's vx, vy (0: off)")
    push_interval_s: List[float] = _range(5.0, 10.0, "time between pushes, drawn per push (s)")
    domain_randomization: bool = _f(
        False, "randomise floor friction, masses, kp and kd per episode"
    )
    positive_reward: bool = _f(
        True, "clip each step's reward (0.02 x weighted sum) at 0, so falling never pays"
    )
    privileged_obs: bool = _f(
        False,
        "append privileged state (trunk-frame velocity, trunk height, foot contacts and heights) "
        "after the observation: PPO's critic sees it, its policy does not (asymmetric critic)",
    )
    rew_tracking_lin_vel: float = _f(1.0, "reward weight: linear velocity tracking (x, y)")
    rew_tracking_ang_vel: float = _f(0.5, "reward weight: yaw rate tracking")
    rew_upright: float = _f(0.0, "reward weight: max(0, z of the trunk's up axis)")
    rew_lin_vel_z: float = _f(-2.0, "reward weight: vertical velocity squared")
    rew_ang_vel_xy: float = _f(-0.05, "reward weight: roll and pitch rate squared")
    rew_orientation: float = _f(-5.0, "reward weight: tilt (gravity x, y in the trunk frame)^2")
    rew_base_height: float = _f(-10.0, "reward weight: (trunk height - base_height_target)^2")
    rew_action_rate: float = _f(-0.01, "reward weight: sum of squared action changes")
    rew_similar_to_default: float = _f(-0.05, "reward weight: sum |q - default pose|")
    rew_pose: float = _f(0.0, "reward weight: exp(-sum (q - default pose)^2)")
    rew_feet_air_time: float = _f(0.0, "reward weight: air time of each finished swing")
    rew_feet_swing_height: float = _f(1.0, "reward weight: feet follow the gait clock's heights")
    rew_foot_clearance: float = _f(0.0, "reward weight: feet moving below the swing height")
    rew_foot_slip: float = _f(-0.1, "reward weight: squared speed of the feet in contact")
    rew_termination: float = _f(0.0, "reward weight: 1 on the step the robot falls")
    autoreset_mode: str = _f("next_step", "vector autoreset", ("next_step", "same_step"))
    info_mode: str = _f(
        "none",
        "vector env infos: none = {} (RLlib-safe; reward/termination stats via pop_log), "
        "full = per-env arrays plus infos['log']",
        ("none", "full"),
    )
    allow_overcommit: bool = _f(False, "allow num_threads above 8 or above the machine's cores")


@dataclass
class Go2JoystickFlatConfig(JoystickConfig):
    """Go2-like quadruped on flat ground: the JoystickConfig defaults."""


@dataclass
class MicroduckJoystickConfig(JoystickConfig):
    """Microduck walking on commands (weights and ranges from the upstream walking variant)."""

    action_scale: float = _f(0.35, "servo target = stand pose + action_scale * action (rad)")
    lin_vel_x: List[float] = _range(-0.4, 0.4, "forward velocity command range (m/s)")
    lin_vel_y: List[float] = _range(-0.3, 0.3, "sideways velocity command range (m/s)")
    ang_vel_yaw: List[float] = _range(-1.0, 1.0, "yaw rate command range (rad/s)")
    gait_freq_hz: float = _f(
        0.0, "gait clock frequency (Hz); 0 turns the clock and its foot-phase observation off"
    )
    swing_height: float = _f(0.03, "apex height of a swing (m): feet_swing_height, foot_clearance")
    tracking_sigma_lin: float = _f(0.1, "tracking_lin_vel = exp(-|v_xy error|^2 / this)")
    tracking_sigma_ang: float = _f(0.5, "tracking_ang_vel = exp(-yaw rate error^2 / this)")
    base_height_target: float = _f(0.12, "trunk height (m) the base_height penalty aims at")
    air_time_min_s: float = _f(0.125, "feet_air_time pays air time above this (s)")
    air_time_max_s: float = _f(0.3, "... up to this (s)")
    init_noise: float = _f(0.02, "uniform initial joint noise (rad), clamped to joint limits")
    push_vel: float = _f(0.3, "push: uniform +/- this (m/s) added to the trunk's vx, vy (0: off)")
    push_interval_s: List[float] = _range(3.0, 6.0, "time between pushes, drawn per push (s)")
    rew_tracking_lin_vel: float = _f(2.0, "reward weight: linear velocity tracking (x, y)")
    rew_tracking_ang_vel: float = _f(2.0, "reward weight: yaw rate tracking")
    rew_upright: float = _f(2.0, "reward weight: max(0, z of the trunk's up axis)")
    rew_lin_vel_z: float = _f(0.0, "reward weight: vertical velocity squared")
    rew_ang_vel_xy: float = _f(0.0, "reward weight: roll and pitch rate squared")
    rew_orientation: float = _f(0.0, "reward weight: tilt (gravity x, y in the trunk frame)^2")
    rew_base_height: float = _f(0.0, "reward weight: (trunk height - base_height_target)^2")
    rew_action_rate: float = _f(-0.1, "reward weight: sum of squared action changes")
    rew_similar_to_default: float = _f(0.0, "reward weight: sum |q - default pose|")
    rew_pose: float = _f(1.0, "reward weight: exp(-sum (q - default pose)^2)")
    rew_feet_air_time: float = _f(3.0, "reward weight: air time of each finished swing")
    rew_feet_swing_height: float = _f(0.0, "reward weight: feet follow the gait clock's heights")
    rew_foot_clearance: float = _f(-2.0, "reward weight: feet moving below the swing height")
    rew_foot_slip: float = _f(-0.1, "reward weight: squared speed of the feet in contact")


@dataclass
class TaskSpec:
    """A named task: its Gymnasium id, its options, and defaults that differ per algorithm."""

    name: str
    gym_id: str
    entry_point: str = ""  # the single env, "module:Class" (gymnasium.make)
    vector_entry_point: str = ""  # the batched env (gymnasium.make_vec, vector_entry_point)
    config_cls: type = EnvConfig
    description: str = ""
    algo_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    env_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)


TASKS: Dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    TASKS[spec.name] = spec
    return spec


# Envs per EnvRunner for the MuJoCo robot tasks: on-policy batches from 32 envs; SAC's one
# update per env step keeps its envs fewer.
ROBOT_ENV_DEFAULTS = {"appo": {"num_envs": 32}, "ppo": {"num_envs": 32}, "sac": {"num_envs": 8}}

register_task(
    TaskSpec(
        name="microduck_balance",
        gym_id="raylab/MicroduckBalance-v0",
        entry_point="raylab.envs.tasks.microduck_balance:MicroduckBalanceEnv",
        vector_entry_point="raylab.envs.tasks.microduck_balance_vec:MicroduckBalanceVecEnv",
        config_cls=MicroduckBalanceConfig,
        description="14-servo duck robot that must stay standing under pushes",
        env_defaults=ROBOT_ENV_DEFAULTS,
    )
)


# PPO / APPO settings of both joystick tasks. Exploration: std 1 at the start (init_log_std -1
# settles on standing still) and no entropy bonus (with actions clipped to [-1, 1] a bonus grows
# the std without bound and the mean action stops being a controller); see docs/envs.md.
JOYSTICK_ALGO_DEFAULTS = {
    "ppo": {
        "lr": 5e-4,
        "gamma": 0.99,
        "lambda_": 0.95,
        "train_batch_size": 8192,
        "minibatch_size": 1024,
        "num_epochs": 5,
        "entropy_coeff": 0.0,
        "init_log_std": 0.0,
        "hidden": [256, 128],
    },
    "appo": {"lr": 3e-4, "hidden": [256, 128]},
}

register_task(
    TaskSpec(
        name="go2_joystick_flat",
        gym_id="raylab/Go2JoystickFlat-v0",
        entry_point="raylab.envs.tasks.go2:Go2JoystickFlatEnv",
        vector_entry_point="raylab.envs.tasks.go2:Go2JoystickFlatVecEnv",
        config_cls=Go2JoystickFlatConfig,
        description="Go2-like quadruped tracking (vx, vy, yaw rate) commands on flat ground",
        algo_defaults={
            "ppo": {**JOYSTICK_ALGO_DEFAULTS["ppo"], "activation": "tanh"},
            "appo": JOYSTICK_ALGO_DEFAULTS["appo"],
            "sac": {"hidden": [256, 256]},
        },
        # The critic of PPO / APPO sees privileged state (trunk-frame velocity, height, foot
        # contacts and heights), as in the public legged velocity-tracking tasks: with it PPO
        # tracks commands within the targets in 15 minutes here (0.32 m/s, 0.15 rad/s;
        # benchmarks/learning/x_go2_ppo_priv_15min.json). SAC keeps the plain observation:
        # its actor would see the privileged state (config refuses it).
        env_defaults={
            "appo": {**ROBOT_ENV_DEFAULTS["appo"], "privileged_obs": True},
            "ppo": {**ROBOT_ENV_DEFAULTS["ppo"], "privileged_obs": True},
            "sac": ROBOT_ENV_DEFAULTS["sac"],
        },
    )
)

register_task(
    TaskSpec(
        name="microduck_joystick",
        gym_id="raylab/MicroduckJoystick-v0",
        entry_point="raylab.envs.tasks.microduck_joystick:MicroduckJoystickEnv",
        vector_entry_point="raylab.envs.tasks.microduck_joystick:MicroduckJoystickVecEnv",
        config_cls=MicroduckJoystickConfig,
        description="14-servo duck robot walking on (vx, vy, yaw rate) commands",
        algo_defaults=JOYSTICK_ALGO_DEFAULTS,
        env_defaults=ROBOT_ENV_DEFAULTS,
    )
)
