"""The task table: names, Gymnasium ids, typed env options and per-algorithm defaults.

This module is light (no MuJoCo import) so the CLI can compose and print configs quickly.
Each task's environment code lives in its own module and is registered with Gymnasium by
``raylab.envs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from omegaconf import MISSING


def _f(default: Any = MISSING, help: str = "", choices: Tuple[str, ...] = (), factory=None):
    meta = {"help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EnvConfig:
    """Options every task has. Any Gymnasium id uses exactly these."""

    gym_id: str = _f(MISSING, "Gymnasium id the task is registered under (set by --task)")
    num_envs: int = _f(16, "envs stepped by each EnvRunner (one batched vector env)")
    num_threads: int = _f(1, "physics threads per EnvRunner (raylab tasks only)")
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
    autoreset_mode: str = _f("next_step", "vector autoreset", ("next_step", "same_step"))
    info_mode: str = _f(
        "none",
        "vector env infos: none = {} (RLlib-safe; reward/termination stats via pop_log), "
        "full = per-env arrays plus infos['log']",
        ("none", "full"),
    )
    allow_overcommit: bool = _f(False, "allow num_threads above 8 or above the machine's cores")


@dataclass
class TaskSpec:
    """A named task: its Gymnasium id, its options, and defaults that differ per algorithm."""

    name: str
    gym_id: str
    config_cls: type = EnvConfig
    description: str = ""
    algo_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    env_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)


TASKS: Dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    TASKS[spec.name] = spec
    return spec


register_task(
    TaskSpec(
        name="microduck_balance",
        gym_id="raylab/MicroduckBalance-v0",
        config_cls=MicroduckBalanceConfig,
        description="14-servo duck robot that must stay standing under pushes",
        env_defaults={
            "appo": {"num_envs": 32},
            "ppo": {"num_envs": 32},
            "sac": {"num_envs": 8},
        },
    )
)


def task_names() -> Tuple[str, ...]:
    return tuple(TASKS)


def lookup(name: str) -> Optional[TaskSpec]:
    return TASKS.get(name)
