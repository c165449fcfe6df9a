"""The task table: names, Gymnasium ids and entry points, the options dataclass of each task,
and per-algorithm defaults; plus what every task's options share (``EnvConfig``, ``option``).

This module is light (no MuJoCo import): each task's options dataclass lives in its task
module, next to its terms, and is imported when that task is composed. ``raylab.envs``
registers the table's tasks with Gymnasium.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

from omegaconf import MISSING


def option(
    default: Any = MISSING,
    help: str = "",
    choices: Tuple[str, ...] = (),
    factory=None,
    training_only: bool = False,
):
    """A config dataclass field with its help text and, for strings, its valid choices.
    ``training_only``: the option shapes the episodes the policy trains on (a push curriculum,
    termination on a fall) but never the task that is evaluated: evaluation (in training,
    ``raylab eval``, the video) builds the env without it, at the field's default."""
    meta = {"help": help, "choices": choices, "training_only": training_only}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# Options that configure the vector env rather than the task; the single (reference) envs accept
# and ignore them, so that one env_config serves both.
VECTOR_ONLY_OPTIONS = (
    "num_threads",
    "allow_overcommit",
    "autoreset_mode",
    "info_mode",
    "debug_leak_kb_per_step",
    "debug_fail_backend_after_steps",
)
# Fields of EnvConfig that are raylab plumbing, not constructor options of an env.
PLUMBING_FIELDS = ("gym_id", "num_envs", "kwargs")


@dataclass
class EnvConfig:
    """Options every task has. Any Gymnasium id uses exactly these."""

    gym_id: str = option(MISSING, "Gymnasium id the task is registered under (set by --task)")
    num_envs: int = option(
        16,
        "envs stepped by each EnvRunner (one vector env); the robot tasks set their own in the "
        "task table: 32 for PPO / APPO, 8 for SAC",
    )
    num_threads: str = option(
        "auto",
        "physics threads per EnvRunner (raylab tasks only): a number, or auto = the CPUs the "
        "EnvRunner may use (on a cluster its reservation, resources.num_cpus_per_env_runner; "
        "with an in-process Ray the machine's cores shared among the EnvRunners, less the "
        "Learners' for SAC, whose learner never waits); results do not depend on it",
    )
    kwargs: Dict[str, Any] = option(help="extra keyword arguments for gymnasium.make", factory=dict)


@dataclass
class BatchedEnvConfig(EnvConfig):
    """Options of every raylab task's batched vector env (the single env ignores them)."""

    autoreset_mode: str = option("next_step", "vector autoreset", ("next_step", "same_step"))
    info_mode: str = option(
        "none",
        "vector env infos: none = {} (RLlib-safe; reward/termination stats via pop_log), "
        "full = per-env arrays plus infos['log']",
        ("none", "full"),
    )
    allow_overcommit: bool = option(False, "allow num_threads above 8 or above the machine's cores")
    debug_leak_kb_per_step: int = option(
        0,
        "test only: the vector env keeps this many KiB per step for good, a deliberate memory "
        "leak (what raylab soak's resource_leak check must catch); keep 0",
    )
    debug_fail_backend_after_steps: int = option(
        0,
        "test only: a physics worker thread raises from this vector step on (what raylab soak "
        "classifies as backend_worker_failure); 0 = never, keep it",
    )


def option_range(low: float, high: float, help: str):
    return option(help=help, factory=lambda: [low, high])


MAX_PUSH_SCALE = 3.0  # a training push curriculum's factor: 0..3 times the task's push speeds


@dataclass
class PushCurriculum:
    """The training-only push curriculum of a task with pushes: its push speeds are multiplied by
    :meth:`push_scale` of the env steps so far, which changes no other draw (1.0 with the
    defaults, and always in evaluation)."""

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

    def push_scale(self, env_steps: int) -> float:
        """The push-speed factor after ``env_steps`` steps of one env (or vector env): linear
        from ``push_scale_start`` to ``push_scale_end`` over ``push_curriculum_steps``, then
        ``push_scale_end``."""
        end = float(self.push_scale_end)
        if int(self.push_curriculum_steps) <= 0:
            return end
        start = float(self.push_scale_start)
        return start + (end - start) * min(1.0, env_steps / int(self.push_curriculum_steps))

    def check_push_curriculum(self) -> None:
        """One-line ``ValueError`` for a bad curriculum value, naming the valid range."""
        if int(self.push_curriculum_steps) < 0:
            raise ValueError(
                f"push_curriculum_steps={self.push_curriculum_steps} is invalid; it must be >= 0"
            )
        for name in ("push_scale_start", "push_scale_end"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and 0 <= v <= MAX_PUSH_SCALE):
                raise ValueError(f"{name}={v} is invalid; valid range: 0..{MAX_PUSH_SCALE}")


@dataclass
class TaskSpec:
    """A named task: its Gymnasium id, its options, and defaults that differ per algorithm."""

    name: str
    gym_id: str
    entry_point: str = ""  # the single env, "module:Class" (gymnasium.make)
    vector_entry_point: str = ""  # the batched env (gymnasium.make_vec, vector_entry_point)
    # The options dataclass, "module:Class" in the task's module (imported only when the task
    # is composed, so this table stays light); EnvConfig for a plain Gymnasium id.
    config: str = ""
    description: str = ""
    algo_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    env_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # ``resources.*`` per algorithm: the layout of EnvRunners this task trains fastest with.
    resources_defaults: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def config_class(self) -> type:
        if not self.config:
            return EnvConfig
        module, _, name = self.config.partition(":")
        return getattr(importlib.import_module(module), name)

    def training_only_options(self) -> Dict[str, Any]:
        """The options evaluation runs at their defaults (``option(training_only=True)``):
        name -> default."""
        from dataclasses import fields

        options = fields(self.config_class())
        return {f.name: f.default for f in options if f.metadata.get("training_only")}


TASKS: Dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    TASKS[spec.name] = spec
    return spec


# PPO on any Gymnasium id (not a raylab task): the reference PPO's layout for continuous
# control (one env, 2,048-step batches, 64-step minibatches, 10 epochs, learning rate annealed
# to 0, std 1 at the start, 64-64 tanh networks, gradient norm clipped at 0.5) with observations
# normalised and rewards scaled by the running return's std. raylab's robot-task PPO defaults
# (8,192-step batches of 1,024, 5 epochs, log-std -1, 256-256, neither normalisation) learned
# far below the reference returns on Gymnasium MuJoCo; these reach HalfCheetah-v5 about 1,600
# at 500k env steps and its 1M steps in about 22 minutes on 2 cores (benchmarks/README.md,
# "Parity with the reference implementations").
GYMNASIUM_ALGO_DEFAULTS = {
    "ppo": {
        "train_batch_size": 2048,
        "minibatch_size": 64,
        "num_epochs": 10,
        "lr": 3e-4,
        "lr_schedule": "linear",
        "init_log_std": 0.0,
        "hidden": [64, 64],
        "grad_clip": 0.5,
        "normalize_obs": True,
        "scale_rewards": True,
    },
    # SAC on any Gymnasium id: the reference SAC's settings (critic and temperature learning
    # rate 1e-3, 5,000 random env steps first, no gradient clipping, the mean squared TD error,
    # one batch-256 update per env step) on 8 envs. HalfCheetah-v5, 100k env steps, seed 0: MSE
    # 5,543 / Huber 5,026 for the episodes ending near 96k (benchmarks/README.md, "Gymnasium
    # parity"). The update stays on one torch thread per half: two ran it 1.6x faster alone but
    # made the whole run 0.74x as fast on 2 cores (results/train_sac_halfcheetah_threads.json);
    # the update split over two threads (algo.split_update, on by default on 2+ cores) made it
    # 1.28x as fast (93 -> 119 updates/s; results/train_sac_halfcheetah_split.json).
    "sac": {
        "critic_lr": 1e-3,
        "alpha_lr": 1e-3,
        "learning_starts": 5000,
        "grad_clip": None,
        "critic_loss": "mse",
    },
}
GYMNASIUM_ENV_DEFAULTS = {"ppo": {"num_envs": 1}, "sac": {"num_envs": 8}}

# Settings tuned for one Gymnasium task family (the id without its version), on top of the
# defaults above. PPO on HalfCheetah: the RL Baselines3 Zoo's tuned settings for the task (512-step
# batches of 64, 20 epochs, clip 0.1, lr 2.06e-5 constant, gamma 0.98, lambda 0.92, a free log std
# from -2, 256-256 ReLU, no value-loss clamp). With the reference PPO's layout above the task
# reached 1,654-1,819 at 1M env steps on every variant of it that was tried (seed 0); with these
# 3,698 at 300k and 5,678 at 1M (mean of the last 100 episodes, seed 0; the reference's curve:
# 1,700 and 2,900); with the PPO Learner's own minibatch loop seeds 1 and 0 reached 5,917 and
# 5,215 in 22.0 and 22.9 minutes per 1M (39.7 with RLlib's; benchmarks/README.md, "Gymnasium
# parity").
GYMNASIUM_FAMILY_ALGO_DEFAULTS = {
    "HalfCheetah": {
        "ppo": {
            "train_batch_size": 512,
            "minibatch_size": 64,
            "num_epochs": 20,
            "lr": 2.0633e-5,
            "lr_schedule": "constant",
            "gamma": 0.98,
            "lambda_": 0.92,
            "clip_param": 0.1,
            "entropy_coeff": 0.000401762,
            "grad_clip": 0.8,
            "vf_loss_coeff": 0.58096,
            "vf_clip_param": 1e9,
            "free_log_std": True,
            "init_log_std": -2.0,
            "activation": "relu",
            "hidden": [256, 256],
        },
    },
    # PPO on Walker2d: the RL Baselines3 Zoo's tuned settings for the task (512-step batches of
    # 32, 20 epochs, clip 0.1, lr 5.05e-5 constant, 64-64 tanh with orthogonal initial weights,
    # a free log std from 0, no value-loss clamp). Seeds 0 / 1 / 2 reached 2,386 / 3,358 / 3,293
    # at 1M env steps, 3,012 +/- 543 (mean of the last 100 episodes; the reference's curve 3,200,
    # its two releases' tables 2,288 and 2,891), in 24.6 minutes per 1M on average; with the
    # learning rate annealed to 0 seed 0 reached 2,265 (benchmarks/README.md, "Gymnasium
    # parity").
    "Walker2d": {
        "ppo": {
            "train_batch_size": 512,
            "minibatch_size": 32,
            "num_epochs": 20,
            "lr": 5.05041e-5,
            "lr_schedule": "constant",
            "gamma": 0.99,
            "lambda_": 0.95,
            "clip_param": 0.1,
            "entropy_coeff": 0.000585045,
            "grad_clip": 1.0,
            "vf_loss_coeff": 0.871923,
            "vf_clip_param": 1e9,
            "free_log_std": True,
            "orthogonal_init": True,
            "adam_eps": 1e-5,
        },
    },
}


# Env settings for one Gymnasium task family, over GYMNASIUM_ENV_DEFAULTS. SAC on Walker2d: one
# env, the reference SAC's layout. With 8 envs seed 0 passed 3,000 at 190-270k env steps and
# collapsed to 778 at 300k (last 100 episodes 1,460); with one env seeds 0 and 1 reached 4,387
# and 4,359 at 300k (last 100 episodes 3,853 and 3,099; benchmarks/README.md, "Gymnasium
# parity"). One env runs 0.76x as many updates per second (88 against 117;
# benchmarks/results/train_sac_walker2d_envs.json): 57-59 minutes per 300k env steps.
GYMNASIUM_FAMILY_ENV_DEFAULTS = {"Walker2d": {"sac": {"num_envs": 1}}}


def _family(gym_id: str) -> str:
    """The task family of a Gymnasium id: the id without its module and version."""
    return gym_id.split(":")[-1].split("-v")[0]


def _merged(generic, families, gym_id: str) -> Dict[str, Dict[str, Any]]:
    family = families.get(_family(gym_id), {})
    algos = set(generic) | set(family)
    return {a: {**generic.get(a, {}), **family.get(a, {})} for a in algos}


def gymnasium_algo_defaults(gym_id: str) -> Dict[str, Dict[str, Any]]:
    """Per algorithm, the defaults of a Gymnasium id: those of every id, then its family's."""
    return _merged(GYMNASIUM_ALGO_DEFAULTS, GYMNASIUM_FAMILY_ALGO_DEFAULTS, gym_id)


def gymnasium_env_defaults(gym_id: str) -> Dict[str, Dict[str, Any]]:
    """Per algorithm, the env settings of a Gymnasium id: those of every id, then its family's."""
    return _merged(GYMNASIUM_ENV_DEFAULTS, GYMNASIUM_FAMILY_ENV_DEFAULTS, gym_id)


# Envs per EnvRunner for the MuJoCo robot tasks: on-policy batches from 32 envs; SAC's one
# update per env step keeps its envs fewer.
ROBOT_ENV_DEFAULTS = {"appo": {"num_envs": 32}, "ppo": {"num_envs": 32}, "sac": {"num_envs": 8}}

register_task(
    TaskSpec(
        name="microduck_balance",
        gym_id="raylab/MicroduckBalance-v0",
        entry_point="raylab.envs.reference.microduck_balance:MicroduckBalanceEnv",
        vector_entry_point="raylab.envs.tasks.microduck_balance:MicroduckBalanceVecEnv",
        config="raylab.envs.tasks.microduck_balance:MicroduckBalanceConfig",
        description="14-servo duck robot that must stay standing under pushes",
        # SAC: 32 envs and one update per 4 env steps. Its learner is the bottleneck (one core
        # at 100%, about 55-75 updates/s here) and env steps are cheap, so a lower replay ratio
        # buys 3x the env steps for the same updates: 45 minutes took 0.48-0.52 of the headroom
        # (survival 0.71, 610k env steps) against 0.38 at one update per step with 8 envs
        # (200k; benchmarks/learning/x_sac_utd025_45min.json, sac_microduck_balance_s0.json).
        # APPO: rewards scaled by the running return's std. Since APPO bootstraps at each
        # fragment's end (docs/training.md) its value targets are the whole discounted return
        # (about 150), whose value gradient swamped the policy's under the clip at 1.0: a
        # 3-minute run ended at 238.9 (headroom -0.30) without the scaling, 333.3 (0.17) with
        # it; 1.1 M env steps 318 against 355 (benchmarks/learning/
        # appo_microduck_balance_3min_bootfix*_s0.json, appo_microduck_balance_bootfix*_s0.json).
        # PPO: 128 envs per EnvRunner and 128-128 networks. PPO's iteration is a sample of
        # train_batch_size env steps then the update, so a cheaper update and more envs per
        # policy call both shorten it: 0.60 of bare physics against 0.47 (benchmarks/README.md,
        # "A smaller network at 128 envs"), and 30 minutes took 0.377 of the headroom against
        # 0.277 for 32 envs and 256-256 (ppo_microduck_balance_30min_*_s0.json).
        algo_defaults={
            "sac": {"updates_per_step": 0.25},
            "appo": {"scale_rewards": True},
            "ppo": {"hidden": [128, 128]},
        },
        env_defaults={**ROBOT_ENV_DEFAULTS, "sac": {"num_envs": 32}, "ppo": {"num_envs": 128}},
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
        config="raylab.envs.tasks.go2:Go2JoystickFlatConfig",
        description="Go2-like quadruped tracking (vx, vy, yaw rate) commands on flat ground",
        # PPO's std is one learned parameter per joint (free_log_std) under a soft bound that
        # falls from e^2 to e^-1.5 by the run's end (5 M env steps or the time budget): with the
        # state-dependent std of the other tasks the gait leaned on the exploration noise, and
        # two of three seeds fell or stood when acting with the mean. 20-minute runs, seeds 0 /
        # 1 / 2, last checkpoint, 100 episodes: lin 0.255 / 0.453 / 0.469 m/s, yaw 0.169 /
        # 0.194 / 0.322 rad/s, survival 1.00 on all three (before: 0.306 / 0.394 / 0.550,
        # 0.134 / 0.293 / 0.509, survival 1.00 / 0.69 / 0.32; hold pose 0.597 / 0.511);
        # benchmarks/README.md, "Learning", the Go2 paragraphs.
        algo_defaults={
            "ppo": {
                **JOYSTICK_ALGO_DEFAULTS["ppo"],
                "activation": "tanh",
                "free_log_std": True,
                "max_log_std": 2.0,
                "final_max_log_std": -1.5,
            },
            "appo": JOYSTICK_ALGO_DEFAULTS["appo"],
            "sac": {"hidden": [256, 256]},
        },
        # The critic of PPO / APPO sees privileged state (trunk-frame velocity, height, foot
        # contacts and heights), as in the public legged velocity-tracking tasks: with it PPO
        # tracks commands within the targets in 15 minutes here (0.32 m/s, 0.15 rad/s;
        # benchmarks/learning/x_go2_ppo_priv_15min.json). SAC keeps the plain observation:
        # its actor would see the privileged state (config refuses it).
        # PPO trains with pushes of up to 0.5 m/s every 5-10 s (training only: the evaluated
        # task has none): over seeds 0-2 its best checkpoints fell in 2 of 1,200 evaluation
        # episodes against 10 of 1,200 without, at the same tracking (benchmarks/README.md,
        # "Learning", "Training-only pushes" in the Go2 paragraphs).
        # PPO also pays a fall penalty of 200 x 0.02 s = 4 (about a hundred steps' reward): with
        # it the best checkpoints of seeds 0-2 met the Go2 target (lin 0.35, yaw 0.30, survival
        # 1.0 on seeds 1000-1099) on all three seeds, tracking at 0.163 / 0.131 mean against
        # 0.215 / 0.169 without it (benchmarks/README.md, "A fall penalty").
        env_defaults={
            "appo": {**ROBOT_ENV_DEFAULTS["appo"], "privileged_obs": True},
            "ppo": {
                **ROBOT_ENV_DEFAULTS["ppo"],
                "privileged_obs": True,
                "train_push_vel": 0.5,
                "rew_termination": -200.0,
            },
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
        config="raylab.envs.tasks.microduck_joystick:MicroduckJoystickConfig",
        description="14-servo duck robot walking on (vx, vy, yaw rate) commands",
        algo_defaults=JOYSTICK_ALGO_DEFAULTS,
        env_defaults=ROBOT_ENV_DEFAULTS,
    )
)
