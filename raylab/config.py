"""Typed, composable configuration.

A run's configuration is one tree of dataclasses with four groups:

- ``training.*``  logging backend, run directory, seed, budget, checkpoint cadence, traces
- ``algo.*``      the algorithm's hyperparameters (one dataclass per algorithm)
- ``env.*``       the task's options (one dataclass per task; any Gymnasium id gets the base one)
- ``resources.*`` EnvRunners, Learners, GPUs, the Ray address

It is composed in this order: algorithm defaults, task defaults (``TaskSpec.algo_defaults``,
``env_defaults``, ``resources_defaults``), then Hydra-style dotted overrides
(``algo.lr=3e-4 env.num_envs=64``). OmegaConf does the parsing and type checking against the
dataclasses; bad input becomes a ``UserError``.
Every field carries ``metadata["help"]``; ``describe`` turns that into ``--help`` text.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from raylab.envs.tasks import (
    TASKS,
    EnvConfig,
    TaskSpec,
    gymnasium_algo_defaults,
    gymnasium_env_defaults,
    option,
)
from raylab.errors import UserError, choices_hint

SIMS = ("mujoco",)


# --------------------------------------------------------------------------------- training


@dataclass
class TrainingConfig:
    logger: str = option("tensorboard", "persistent metric backend", ("tensorboard", "wandb"))
    log_root: Optional[str] = option(
        None, "folder that holds run directories; default logs/<algo_log_name>/<task>"
    )
    log_dir: Optional[str] = option(
        None, "exact run directory (overrides log_root); must not exist"
    )
    wandb_project: str = option("raylab", "W&B project")
    wandb_entity: Optional[str] = option(None, "W&B entity (team or user)")
    wandb_group: Optional[str] = option(None, "W&B group")
    wandb_name: Optional[str] = option(None, "W&B run name; default the run directory name")
    wandb_tags: List[str] = option(help="W&B tags", factory=list)
    wandb_notes: Optional[str] = option(None, "W&B notes")
    wandb_mode: str = option("online", "W&B mode", ("online", "offline", "disabled"))
    seed: int = option(0, "seed for the algorithm, the EnvRunners and the envs")
    total_steps: int = option(5_000_000, "stop after this many env steps sampled")
    time_budget_s: Optional[float] = option(
        180.0, "stop after this many seconds of training (null: no time limit)"
    )
    stop_reward: Optional[float] = option(
        None, "also stop once Train/mean_reward reaches this value (null: never)"
    )
    stop_eval_reward: Optional[float] = option(
        None,
        "also stop once an evaluation's Eval/mean_reward reaches this value (null: never); "
        "needs eval_every > 0",
    )
    checkpoint_every: int = option(
        20, "checkpoint every N training iterations (0: only at the end)"
    )
    max_failures: int = option(
        3,
        "times Tune restores a failed trial from its last checkpoint (a Learner or the "
        "algorithm's actor killed, a node lost); an env that keeps raising stops the run after "
        "its third report whatever this says",
    )
    max_env_runner_restarts: int = option(
        1000,
        "times a crashed EnvRunner (its process killed) is restarted before the run fails "
        "(0: the first crash fails it); an env that raises deterministically stops the run "
        "after a few restarts whatever this says",
    )
    reward_window: int = option(
        100, "Train/mean_reward and Train/mean_episode_length: mean over this many latest episodes"
    )
    episode_log: bool = option(
        False,
        "also write every finished training episode to episodes.csv in the run directory (env "
        "steps when its iteration ended, return, length): curves at any smoothing "
        "(benchmarks/parity)",
    )
    eval_every: int = option(
        100,
        "evaluate every N training iterations (0: off): deterministic actions on fixed seeds, "
        "reported as Eval/*; the best score's checkpoint is kept as checkpoints/best; the "
        "defaults cost a default 3-minute run about 4% of its wall time (docs/training.md)",
    )
    eval_before_train: bool = option(
        True, "also evaluate the initial policy once before the first update (Eval/* at step 0)"
    )
    eval_background: bool = option(
        True,
        "run each evaluation beside training, on a thread at idle priority in the algorithm's "
        "process (its results come with the first iteration after it ends); false: after the "
        "iteration's training, which waits for it",
    )
    eval_episodes: int = option(
        100, "episodes per evaluation (episode k seeded eval_seed + k): the baselines' protocol"
    )
    eval_seed: int = option(
        1000, "seed of the first evaluation episode (raylab eval's default too)"
    )
    iteration_s: float = option(
        1.0, "minimum wall time of one training iteration (RLlib min_time_s_per_iteration)"
    )
    terminal: str = option(
        "auto",
        "live panel (TTY), plain progress lines, or nothing",
        ("auto", "live", "plain", "off"),
    )
    fast_sampler: Optional[bool] = option(
        None,
        "PPO / APPO sample raylab tasks with raylab's rollout loop (one forward pass and one env "
        "step per vector step, episodes built once per fragment); false: RLlib's own EnvRunner "
        "loop; null: on for raylab tasks, off for Gymnasium ids (which it does not support)",
    )
    # The metric contract's trace options (raylab.metrics.trace).
    trace_enabled: bool = option(
        False,
        "Perfetto / Chrome trace-event files of every phase, one per process (raylab trace "
        "RUN_DIR merges them)",
    )
    trace_output_dir: Optional[str] = option(
        None, "trace folder (null: <run_dir>/traces); needs trace_enabled"
    )
    trace_thread_time: bool = option(
        False, "thread CPU time (thread_cpu_ms) on every traced phase; needs trace_enabled"
    )
    trace_cuda_events: bool = option(
        False,
        "time the learner's device work with CUDA events on a CUDA track; needs trace_enabled "
        "and GPU learners (refused on CPU)",
    )


# ------------------------------------------------------------------------------------ algos


@dataclass
class AlgoConfig:
    name: str = option(MISSING, "algorithm name (set by --algo)")
    algo_log_name: str = option(MISSING, "folder name under logs/ for this algorithm")
    gamma: float = option(0.99, "discount factor")
    hidden: List[int] = option(
        help="hidden layer sizes of policy and value nets", factory=lambda: [256, 256]
    )
    activation: str = option("tanh", "hidden activation", ("tanh", "relu", "silu", "elu"))
    grad_clip: Optional[float] = option(1.0, "global gradient-norm clip (null: off)")


@dataclass
class OnPolicyConfig(AlgoConfig):
    """What PPO and APPO share: one learning rate for policy and value, a Gaussian policy whose
    log std is an output of the policy network or (free_log_std) a parameter of its own. (SAC
    has its own three learning rates and a squashed policy.)"""

    lr: float = option(3e-4, "learning rate")
    lr_schedule: str = option(
        "constant",
        "constant; linear: from lr down to 0 at training.total_steps env steps; adaptive_kl: lr "
        "is the start, divided by 1.5 after a minibatch whose KL from the sampling policy "
        "exceeds 2 x lr_kl_target and multiplied by 1.5 below half of it, within [1e-5, 1e-2]",
        ("constant", "linear", "adaptive_kl"),
    )
    lr_kl_target: Optional[float] = option(
        None,
        "the KL per minibatch that lr_schedule=adaptive_kl steers the learning rate to (null: "
        "0.01; only with adaptive_kl)",
    )
    init_log_std: float = option(
        -1.0, "initial log std of the Gaussian policy (continuous actions)"
    )
    init_policy_scale: float = option(
        0.01, "scale of the initial policy output weights (near-zero initial mean action)"
    )
    adam_eps: float = option(
        1e-8, "Adam's epsilon (torch's default 1e-8; the reference PPO uses 1e-5)"
    )
    orthogonal_init: bool = option(
        False,
        "orthogonal initial weights, as the reference PPO: gain sqrt(2) for hidden layers, 1 for "
        "the value output, init_policy_scale for the policy's mean output; biases 0 (false: "
        "torch's default initialisation)",
    )
    free_log_std: bool = option(
        False,
        "state-independent log std: one learned parameter per action dimension (RLlib's "
        "free_log_std) instead of half of the policy network's output",
    )
    max_log_std: Optional[float] = option(
        None,
        "soft upper bound of the policy's log std (max - softplus(max - raw)); null: unbounded",
    )
    final_max_log_std: Optional[float] = option(
        None,
        "move the max_log_std bound linearly to this value by the run's end: training.total_steps "
        "env steps or, when set, training.time_budget_s seconds, whichever comes first; the "
        "exploration noise shrinks late in training (null: the bound stays constant)",
    )
    noise_correlation: float = option(
        0.0,
        "correlation in [0, 1) of the exploration noise from one step to the next: each env's "
        "Gaussian noise follows an AR(1) process over its episode (0.9: about 10 steps of "
        "memory), so exploration moves the servos in smooth strokes instead of a jitter they "
        "filter out; 0: independent draws, RLlib's (raylab's rollout loop, Box actions)",
    )
    scale_rewards: bool = option(
        False,
        "divide the rewards the learner trains on by the running std of the discounted return "
        "(reported returns stay the task's own)",
    )
    normalize_obs: bool = option(
        False,
        "normalise observations by their running mean and std (clipped to +-10) in front of the "
        "policy and the value function; the statistics live in the module, so they travel with "
        "its weights into EnvRunners, evaluation and checkpoints",
    )


@dataclass
class PPOConfig(OnPolicyConfig):
    name: str = "ppo"
    algo_log_name: str = "ppo"
    train_batch_size: int = option(8192, "env steps per learner update (per learner)")
    minibatch_size: int = option(1024, "SGD minibatch size")
    num_epochs: int = option(5, "SGD passes over each train batch")
    lambda_: float = option(0.95, "GAE lambda")
    clip_param: float = option(0.2, "PPO policy clip")
    vf_clip_param: float = option(10.0, "value-function clip")
    vf_loss_coeff: float = option(0.5, "value loss weight")
    entropy_coeff: float = option(0.0, "entropy bonus weight")
    kl_coeff: float = option(0.0, "initial KL penalty weight (0: off)")
    kl_target: float = option(0.01, "KL target for the adaptive penalty")
    learner_threads: Optional[int] = option(
        None,
        "torch threads of a CPU Learner's update (null: with one Learner and minibatches of at "
        "least 512 rows the cores of its machine, since PPO samples while nobody learns and "
        "learns while nobody samples; smaller minibatches or several Learners: 1 each)",
    )


@dataclass
class APPOConfig(OnPolicyConfig):
    name: str = "appo"
    algo_log_name: str = "appo"
    lr: float = 5e-4
    train_batch_size: int = option(2048, "env steps per learner update (per learner)")
    rollout_fragment_length: int = option(32, "env steps per env per EnvRunner rollout")
    vtrace: bool = option(True, "V-trace off-policy correction")
    clip_param: float = option(0.4, "surrogate clip")
    vf_loss_coeff: float = option(0.5, "value loss weight")
    entropy_coeff: float = option(0.0, "entropy bonus weight")
    use_kl_loss: bool = option(False, "add a KL loss to the old policy")
    kl_coeff: float = option(1.0, "KL loss weight (use_kl_loss)")
    circular_buffer_num_batches: int = option(4, "batches kept in the learner's circular buffer")
    circular_buffer_iterations_per_batch: int = option(2, "times each batch is trained on")
    target_network_update_freq: int = option(2, "target-network update period (in train batches)")
    broadcast_interval: int = option(1, "weight broadcast to EnvRunners every N updates")
    sample_requests_in_flight: int = option(
        1,
        "sample requests queued at each EnvRunner (RLlib's max_requests_in_flight_per_env_runner"
        "): 2 lets an EnvRunner start its next rollout as it hands one over, one rollout more "
        "behind the learner's weights",
    )


@dataclass
class SACConfig(AlgoConfig):
    name: str = "sac"
    algo_log_name: str = "sac"
    activation: str = option("relu", "hidden activation", ("tanh", "relu", "silu", "elu"))
    actor_lr: float = option(3e-4, "policy learning rate")
    critic_lr: float = option(3e-4, "Q-function learning rate")
    alpha_lr: float = option(3e-4, "temperature learning rate")
    tau: float = option(0.005, "polyak coefficient of the target Q nets")
    initial_alpha: float = option(1.0, "initial entropy temperature")
    target_entropy: Optional[float] = option(None, "target entropy (null: -action_dim)")
    log_std_min: float = option(
        -20.0,
        "floor of the policy's log-std before tanh (-20: the SAC paper's code; -5 keeps a "
        "nearly deterministic action's Gaussian log-probability under about 4 per action)",
    )
    mean_bound: Optional[float] = option(
        None,
        "soft bound on the policy's pre-tanh mean, bound * tanh(mean / bound) (null: none; "
        "e.g. 5: every action still reaches tanh(5) = 0.9999, and the tanh's term of the "
        "log-probability stays under about 2 x bound per action where the policy saturates)",
    )
    batch_size: int = option(256, "replay batch size per update")
    buffer_capacity: int = option(1_000_000, "replay ring capacity (transitions)")
    learning_starts: int = option(1000, "env steps collected before the first update")
    updates_per_step: float = option(1.0, "gradient updates per env step (replay ratio)")
    weight_sync_every: int = option(1, "publish weights to EnvRunners every N updates")
    env_steps_per_sync: int = option(
        4, "vector env steps per EnvRunner request (transitions travel in these batches)"
    )
    learner_threads: Optional[int] = option(
        None,
        "torch threads of a CPU learner's update (null: resources.num_cpus_per_learner, at "
        "least 1; at most the learner's usable cores): for machines with cores to spare; on 2 "
        "cores a second thread made SAC on HalfCheetah-v5 0.74x as fast",
    )
    torch_compile: bool = option(False, "torch.compile the fused update (GPU learners only)")
    bf16_autocast: bool = option(False, "bf16 autocast in the update (GPU learners only)")
    critic_loss: str = option(
        "huber",
        "critic loss on the TD error: huber (delta 1, RLlib's SAC) or mse (the SAC papers', "
        "CleanRL's)",
        ("huber", "mse"),
    )
    reward_scale: float = option(
        1.0,
        "multiply the rewards the critics learn from (the replay holds scaled rewards; every "
        "reported return stays the task's own): SAC's temperature is on the reward's scale, so "
        "a task that pays a few hundredths per step needs a larger scale or the entropy term "
        "drowns the reward",
    )
    split_update: Optional[bool] = option(
        None,
        "each update's actor half (forward and backward) on a second thread while the critics' "
        "half runs, the same step on two cores (CPU learners, one Learner; null: on where the "
        "Learner's process may use 2 or more cores)",
    )
    store_buffer_in_checkpoints: bool = option(
        False,
        "keep the replay ring in every checkpoint (the Learner's counters with it), so a "
        "resumed or restored run goes on as it would have; without it, a restored run refills "
        "the ring from new samples. Costs the ring's size on disk per checkpoint: 42 floats per "
        "HalfCheetah transition, about 170 MB at a million",
    )


ALGOS: Dict[str, type] = {"ppo": PPOConfig, "appo": APPOConfig, "sac": SACConfig}


# -------------------------------------------------------------------------------- resources


@dataclass
class ResourcesConfig:
    num_env_runners: int = option(1, "EnvRunner actors (each steps one batched env)")
    num_cpus_per_env_runner: float = option(1.0, "CPUs reserved per EnvRunner")
    num_learners: int = option(1, "Learner actors (0: learn inside the algorithm actor)")
    num_gpus_per_learner: Optional[float] = option(
        None, "GPUs per Learner (null: 1 if this machine or cluster has a GPU, else 0)"
    )
    num_cpus_per_learner: float = option(
        0.5,
        "CPUs reserved per Learner on CPU (a GPU Learner reserves 1); a PPO / APPO Learner "
        "waits on the EnvRunners most of the iteration",
    )
    custom_resources_per_env_runner: Dict[str, float] = option(
        help="Ray custom resources each EnvRunner needs (places them on matching nodes)",
        factory=dict,
    )
    custom_resources_per_learner: Dict[str, float] = option(
        help="Ray custom resources each Learner needs (e.g. {raylab_learner: 1})", factory=dict
    )
    num_cpus_for_main_process: float = option(
        0.5,
        "CPUs reserved for the algorithm's main process (RLlib num_cpus_for_main_process); it "
        "only coordinates EnvRunners and Learners (a small share of one core): with a Learner "
        "and an EnvRunner the default layout reserves 2 CPUs, so it fits a 2-CPU node; with "
        "num_learners=0 it learns itself and reserves num_cpus_per_learner",
    )
    wait_s: float = option(
        600.0,
        "longest wait for the cluster to grant the run's resources (busy nodes, or nodes an "
        "autoscaler adds: a cloud node boots and joins in about 2-5 min) before failing",
    )
    ray_address: Optional[str] = option(
        None, "Ray cluster to join (null: RAY_ADDRESS if set, else start Ray in-process)"
    )
    dashboard: bool = option(True, "start the Ray dashboard with an in-process Ray")


# ------------------------------------------------------------------------------------- root


@dataclass
class RaylabConfig:
    task: str = option(MISSING, "task name or Gymnasium id (set by --task)")
    sim: str = option(
        "mujoco", "physics backend (MuJoCo, the only one; recorded, not chosen)", SIMS
    )
    algo: AlgoConfig = MISSING
    env: EnvConfig = MISSING
    training: TrainingConfig = field(default_factory=TrainingConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)


def task_spec(task: str) -> TaskSpec:
    """The TaskSpec of a raylab task, or a generic one for any registered Gymnasium id."""
    if task in TASKS:
        return TASKS[task]
    import gymnasium as gym

    import raylab.envs  # noqa: F401  (registers raylab/ ids)

    generic = dict(
        algo_defaults=gymnasium_algo_defaults(task), env_defaults=gymnasium_env_defaults(task)
    )
    if task in gym.registry:
        return TaskSpec(name=task, gym_id=task, **generic)
    module, sep, env_id = task.partition(":")
    if sep:  # Gymnasium's "module:EnvId": the module registers the id (also in the EnvRunners)
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"--task {task}: cannot import module '{module}': {e}") from None
        if env_id in gym.registry:
            return TaskSpec(name=task, gym_id=task, **generic)
        raise UserError(f"--task {task}: module '{module}' registers no Gymnasium id '{env_id}'")
    raise UserError(
        choices_hint(task, list(TASKS), "task")
        + " (or any Gymnasium id such as Pendulum-v1, HalfCheetah-v5)"
    )


def compose(
    algo: str = "appo",
    task: str = "microduck_balance",
    sim: str = "mujoco",
    overrides: Tuple[str, ...] | List[str] = (),
) -> DictConfig:
    """Compose algorithm defaults, task defaults and dotted overrides into one typed config."""
    if algo not in ALGOS:
        raise UserError(choices_hint(algo, ALGOS, "algo"))
    if sim not in SIMS:
        raise UserError(choices_hint(sim, SIMS, "sim"))
    spec = task_spec(task)
    env_cfg = spec.config_class()(gym_id=spec.gym_id)
    cfg = OmegaConf.structured(RaylabConfig(task=task, sim=sim, algo=ALGOS[algo](), env=env_cfg))
    layers = [
        spec.algo_defaults.get(algo, {}),
        spec.env_defaults.get(algo, {}),
        spec.resources_defaults.get(algo, {}),
    ]
    for layer_name, layer in zip(("algo", "env", "resources"), layers):
        if layer:
            cfg = OmegaConf.merge(cfg, {layer_name: layer})
    cfg = OmegaConf.merge(cfg, _parse_overrides(cfg, overrides))
    _check_choices(cfg)
    _check_num_threads(cfg)
    _check_fast_sampler(cfg)
    _check_evaluation(cfg)
    _check_privileged_obs(cfg)
    _check_split_update(cfg)
    _check_unsupported(cfg, spec)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _parse_overrides(cfg: DictConfig, overrides) -> DictConfig:
    out = OmegaConf.create({})
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise UserError(f"override '{item}' is not key=value (for example algo.lr=3e-4)")
        key, _, value = item.partition("=")
        if key in ("task", "sim", "algo.name"):
            if key == "sim":
                raise UserError(
                    f"override '{item}': the physics backend is {SIMS[0]}, the only one"
                )
            flag = {"task": "--task", "algo.name": "--algo"}[key]
            raise UserError(f"override '{item}': set {key} with {flag}, not as an override")
        keys = [k for k, _ in iter_keys(cfg)]
        if key not in keys and not _under_open_dict(cfg, key):
            near = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            # algo.lr on SAC: name the keys that end the same way (actor_lr, critic_lr, alpha_lr)
            group, _, leaf = key.rpartition(".")
            same_end = [k for k in keys if k.startswith(group + ".") and k.endswith("_" + leaf)]
            if len(same_end) > 1:
                hint = f" ({cfg.algo.name} has {', '.join(same_end)})"
            group = key.split(".")[0]
            groups = ("training", "algo", "env", "resources")
            where = (
                f"; see `--print-config` for the keys of '{group}'"
                if group in groups
                else f"; groups are {', '.join(groups)}"
            )
            raise UserError(f"unknown config key '{key}'{hint}{where}")
        try:
            parsed = OmegaConf.from_dotlist([item])
            str_field = _is_str_field(cfg, key)
            if str_field == "optional" and value.strip() == "null":
                pass  # null is None for an optional text field (run_config.json writes it so)
            elif str_field and not isinstance(OmegaConf.select(parsed, key), str):
                # YAML would read `off`, `no`, `1e-3` as bool / number; a str field keeps the text.
                parsed = OmegaConf.create({})
                OmegaConf.update(parsed, key, value.strip("'\""), force_add=True)
            out = OmegaConf.merge(out, parsed)
            OmegaConf.merge(cfg, parsed)  # type check against the schema now, per item
        except ValidationError as e:
            expected = _expected_type(cfg, key)
            raise UserError(f"bad value in '{item}': expected {expected}") from e
        except (ConfigKeyError, OmegaConfBaseException) as e:
            raise UserError(f"bad override '{item}': {str(e).splitlines()[0]}") from e
    return out


def _is_str_field(cfg: DictConfig, key: str):
    """False, True (a str field) or "optional" (an Optional[str] field)."""
    parent, _, leaf = key.rpartition(".")
    obj_type = OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg)
    if not dataclasses.is_dataclass(obj_type):
        return False
    for f in dataclasses.fields(obj_type):
        if f.name == leaf:
            if f.type in (Optional[str], "Optional[str]"):
                return "optional"
            return f.type in (str, "str")
    return False


def _under_open_dict(cfg: DictConfig, key: str) -> bool:
    """True when a prefix of key is a free-form dict field (such as env.kwargs)."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        node = OmegaConf.select(cfg, ".".join(parts[:i]))
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict:
            return True
    return False


def _expected_type(cfg: DictConfig, key: str) -> str:
    parent, _, leaf = key.rpartition(".")
    obj_type = OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg)
    current = OmegaConf.select(cfg, key)
    if OmegaConf.is_config(current):
        current = OmegaConf.to_container(current)
    for f in dataclasses.fields(obj_type) if dataclasses.is_dataclass(obj_type) else ():
        if f.name == leaf:
            t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            return f"{t} (current value {current!r})"
    return "a value of the field's type"


def iter_keys(cfg: DictConfig, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Every leaf key of a config (dotted) and its value; lists count as leaves."""
    for k in cfg.keys():
        v = cfg._get_node(k)
        full = f"{prefix}{k}"
        if isinstance(v, DictConfig) and OmegaConf.get_type(v) is dict:
            yield full, OmegaConf.to_container(v)  # a free-form dict (env.kwargs) is one leaf
        elif isinstance(v, DictConfig):
            yield from iter_keys(v, full + ".")
        else:
            yield full, OmegaConf.to_container(v) if OmegaConf.is_list(v) else v._value()


def _check_choices(cfg: DictConfig) -> None:
    for key, meta in _field_meta(cfg):
        choices = meta.get("choices") or ()
        if not choices:
            continue
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            raise UserError(
                f"bad value {key}={value}: valid choices: {', '.join(map(str, choices))}"
            )


def _check_num_threads(cfg: DictConfig) -> None:
    value = str(cfg.env.num_threads)
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise UserError(f"bad value env.num_threads={value}: a positive integer or auto")


def _check_fast_sampler(cfg: DictConfig) -> None:
    want = cfg.training.fast_sampler
    if want is False and cfg.algo.name == "sac":
        raise UserError(
            "training.fast_sampler=false: SAC always samples with raylab's rollout loop "
            "(its learner-owned replay needs flat transitions); use training.fast_sampler=null"
        )
    if want and cfg.task not in TASKS:
        from raylab.algorithms.build import continuous_actions

        if not continuous_actions(cfg):
            raise UserError(
                f"training.fast_sampler=true needs continuous (Box) actions; '{cfg.task}' has "
                "discrete ones, which RLlib's EnvRunner samples: use training.fast_sampler=null "
                "or false"
            )


def _check_split_update(cfg: DictConfig) -> None:
    if cfg.algo.name == "sac" and cfg.algo.get("split_update") is True:
        if int(cfg.resources.num_learners) > 1:
            raise UserError(
                f"algo.split_update=true needs one Learner (resources.num_learners="
                f"{cfg.resources.num_learners}: several all-reduce one fused step); use "
                "algo.split_update=null or false"
            )
        if float(cfg.resources.num_gpus_per_learner or 0) > 0:
            raise UserError(
                "algo.split_update=true is for CPU Learners (resources.num_gpus_per_learner="
                f"{cfg.resources.num_gpus_per_learner}); use algo.split_update=null or false"
            )


def _check_privileged_obs(cfg: DictConfig) -> None:
    if cfg.env.get("privileged_obs", False) and cfg.algo.name not in ("ppo", "appo"):
        raise UserError(
            f"env.privileged_obs=true needs --algo ppo or appo (their asymmetric critic hides "
            f"the privileged state from the policy); {cfg.algo.name} would feed it to the policy"
        )


# Options of the batched vector env that are right for direct use (gymnasium.make_vec, tests,
# baselines) but cannot work inside RLlib's EnvRunners, which raylab train and tune use: RLlib
# expects next-step autoreset (a same-step reset would make the first observation of the next
# episode look like the last one of this) and empty vector infos (its DictInfoToList connector
# asserts on per-env info arrays).
RLLIB_ENV_OPTIONS = {"autoreset_mode": "next_step", "info_mode": "none"}
TRACE_OPTIONS = ("trace_output_dir", "trace_thread_time", "trace_cuda_events")
SAC_LOG_STD_MAX = 2.0  # raylab.algorithms.sac.update.LOG_STD_MAX, without importing torch here


def _refuse_unless_positive(cfg: DictConfig, key: str, valid: str) -> None:
    """One line for an ``algo.<key>`` that is set but not a finite number above 0."""
    value = cfg.algo.get(key)
    if value is not None and not (math.isfinite(float(value)) and float(value) > 0.0):
        raise UserError(f"bad value algo.{key}={value}: {valid}")


def _check_unsupported(cfg: DictConfig, spec: TaskSpec) -> None:
    """Options that would be accepted and then fail or do nothing: refused with one line."""
    if cfg.algo.get("final_max_log_std") is not None and cfg.algo.get("max_log_std") is None:
        raise UserError(
            f"algo.final_max_log_std={cfg.algo.final_max_log_std} needs a starting bound: set "
            "algo.max_log_std too (the bound moves from it to final_max_log_std)"
        )
    _refuse_unless_positive(cfg, "reward_scale", "a number above 0 (1: as paid)")
    _refuse_unless_positive(cfg, "mean_bound", "a number above 0 (e.g. 5), or null")
    _refuse_unless_positive(cfg, "lr_kl_target", "a KL above 0 (e.g. 0.01)")
    flight = cfg.algo.get("sample_requests_in_flight")
    if flight is not None and int(flight) < 1:
        raise UserError(f"bad value algo.sample_requests_in_flight={flight}: 1 or more (1, 2)")
    floor = cfg.algo.get("log_std_min")
    if floor is not None and not (math.isfinite(float(floor)) and float(floor) < SAC_LOG_STD_MAX):
        raise UserError(
            f"bad value algo.log_std_min={floor}: a number below {SAC_LOG_STD_MAX:g} (the "
            "policy's log-std ceiling; e.g. -5 or -20)"
        )
    kl = cfg.algo.get("lr_kl_target")
    if kl is not None and cfg.algo.get("lr_schedule") != "adaptive_kl":
        raise UserError(
            f"algo.lr_kl_target={kl} does nothing with algo.lr_schedule="
            f"{cfg.algo.lr_schedule}: set algo.lr_schedule=adaptive_kl too, or drop it"
        )
    rho = cfg.algo.get("noise_correlation")
    if rho is not None and not 0.0 <= float(rho) < 1.0:
        raise UserError(f"bad value algo.noise_correlation={rho}: a number in [0, 1)")
    if rho and cfg.training.fast_sampler is False:
        raise UserError(
            f"algo.noise_correlation={rho} needs raylab's rollout loop, which "
            "training.fast_sampler=false turns off: use training.fast_sampler=null"
        )
    if rho and cfg.task not in TASKS:
        from raylab.algorithms.build import continuous_actions

        if not continuous_actions(cfg):
            raise UserError(
                f"algo.noise_correlation={rho} needs a Gaussian policy (Box actions); "
                f"'{cfg.task}' has discrete ones: drop it"
            )
    if cfg.training.stop_eval_reward is not None and int(cfg.training.eval_every) <= 0:
        raise UserError(
            f"training.stop_eval_reward={cfg.training.stop_eval_reward} does nothing with "
            "training.eval_every=0 (no evaluation during training); set eval_every > 0, or "
            "drop it"
        )
    if not cfg.training.trace_enabled:
        for key in TRACE_OPTIONS:
            if cfg.training[key] not in (None, False):
                raise UserError(
                    f"training.{key}={_text(cfg.training[key])} does nothing without "
                    "training.trace_enabled=true; set both, or drop it"
                )
    for key, needed in RLLIB_ENV_OPTIONS.items():
        if key in cfg.env and cfg.env[key] != needed:
            raise UserError(
                f"env.{key}={cfg.env[key]} cannot work in RLlib's EnvRunners (raylab train and "
                f"tune need env.{key}={needed}); {cfg.env[key]} is for using the vector env "
                "directly (gymnasium.make_vec)"
            )
    kwargs = dict(cfg.env.kwargs or {})
    if cfg.task in TASKS:
        _check_task_options(cfg, spec)
        fields = {f.name for f in dataclasses.fields(spec.config_class())}
        for key in kwargs:
            if key in fields:
                raise UserError(f"env.kwargs.{key}: set it as env.{key}, the task's own option")
            raise UserError(
                f"env.kwargs.{key}: {cfg.task} has no option '{key}'; its options are the "
                f"env.* keys of `raylab train --task {cfg.task} --print-config`"
            )
        return
    if str(cfg.env.num_threads) != "auto":
        raise UserError(
            f"env.num_threads={cfg.env.num_threads} applies to raylab tasks only; "
            f"'{cfg.task}' is a Gymnasium id (its envs step one by one): leave env.num_threads=auto"
        )
    if kwargs:
        _check_gym_kwargs(cfg.env.gym_id, kwargs)


def _check_task_options(cfg: DictConfig, spec: TaskSpec) -> None:
    """The task's own value checks (its options dataclass's ``check()``), run on the composed
    ``env.*`` now: a bad value is one line before Ray starts, not an EnvRunner that cannot
    build its env."""
    from raylab.envs.core.options import parse_options
    from raylab.envs.tasks import PLUMBING_FIELDS

    env = OmegaConf.to_container(cfg.env, resolve=True)
    options = {k: v for k, v in env.items() if k not in PLUMBING_FIELDS}
    try:
        parse_options(spec.config_class(), options)
    except (TypeError, ValueError) as e:
        raise UserError(f"env: {e}") from None


def _text(value: Any) -> str:
    """A value as it is typed in an override (true, null)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_gym_kwargs(gym_id: str, kwargs: Dict[str, Any]) -> None:
    """Build the Gymnasium env once with env.kwargs: a keyword it does not take (or a value it
    refuses) is one line now, not an EnvRunner that fails in a loop."""
    import gymnasium as gym

    try:
        env = gym.make(gym_id, **kwargs)
    except Exception as e:  # the env's own message, whatever its type
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"env.kwargs {kwargs} for {gym_id}: {type(e).__name__}: {first}") from None
    env.close()


def _check_evaluation(cfg: DictConfig) -> None:
    t = cfg.training
    for key, low in (
        ("reward_window", 1),
        ("eval_every", 0),
        ("eval_episodes", 1),
        ("max_failures", 0),
        ("max_env_runner_restarts", 0),
    ):
        if int(t[key]) < low:
            raise UserError(f"bad value training.{key}={t[key]}: must be at least {low}")
    r = cfg.resources
    for key in ("wait_s", "num_cpus_for_main_process", "num_cpus_per_env_runner"):
        if r[key] < 0:
            raise UserError(f"bad value resources.{key}={r[key]:g}: must be at least 0")


def _field_meta(cfg: DictConfig, prefix: str = "") -> Iterator[Tuple[str, dict]]:
    obj_type = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(obj_type):
        return
    for f in dataclasses.fields(obj_type):
        node = cfg._get_node(f.name)
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node)):
            yield from _field_meta(node, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", dict(f.metadata)


def describe(cfg: DictConfig, groups: Tuple[str, ...] = ()) -> str:
    """Help text: every key with its default and meaning, grouped."""
    lines = []
    current = None
    for key, meta in _field_meta(cfg):
        group = key.split(".")[0] if "." in key else ""
        if groups and group not in groups:
            continue
        if group != current:
            current = group
            lines.append(f"  {group}.*" if group else "  top level")
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        choices = meta.get("choices") or ()
        extra = f" [{'|'.join(choices)}]" if choices else ""
        lines.append(f"    {key}={value!s}{extra}  {meta.get('help', '')}".rstrip())
    return "\n".join(lines)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def to_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
