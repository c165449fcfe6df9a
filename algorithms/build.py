"""Composed raylab config -> RLlib new-API-stack AlgorithmConfig.

One function per algorithm fills the algorithm's own hyperparameters; everything else
(environment, EnvRunners, Learners and their devices, callbacks, reporting cadence, seed) is
shared. Tasks are created inside the EnvRunner actors: raylab tasks through Gymnasium's
``vector_entry_point`` (one batched MuJoCo env per EnvRunner, ``env.num_threads`` threads),
any other Gymnasium id through Gymnasium's own SyncVectorEnv.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

from raylab.envs.core.backend import MAX_THREADS, usable_cores
from raylab.envs.tasks import PLUMBING_FIELDS, TASKS
from raylab.errors import UserError

NEVER = 2**62  # an evaluation interval no run reaches


def physics_threads(cfg: DictConfig) -> int:
    """``env.num_threads`` as a number: the one given, or for ``auto`` the CPUs each EnvRunner
    may use. On a cluster (``resources.ray_address`` or ``RAY_ADDRESS``) that is its own
    reservation, so several EnvRunners on one node never oversubscribe it. With the in-process
    Ray it is the machine's cores shared among the EnvRunners: the driver is idle and a PPO /
    APPO learner waits on the collector most of its iteration (APPO on this project's 2-core
    machine: 82%), but SAC's learner computes all the time, so its CPUs are left to it.
    At most 8 (the backend's limit) and at most one thread per env."""
    value = str(cfg.env.num_threads)
    if value != "auto":
        return int(value)
    r = cfg.resources
    if r.ray_address or os.environ.get("RAY_ADDRESS"):
        n = int(r.num_cpus_per_env_runner)
    else:
        cores = float(usable_cores())
        if cfg.algo.name == "sac":
            cores -= max(1, r.num_learners) * r.num_cpus_per_learner
        n = int(cores // max(1, r.num_env_runners))
    return max(1, min(n, MAX_THREADS, int(cfg.env.num_envs)))


def env_options(cfg: DictConfig, evaluation: bool = False) -> Dict[str, Any]:
    """The keyword arguments the task's vector env receives (besides num_envs). With
    ``evaluation``, the task's training-only options (a push curriculum, termination on a
    fall) at their defaults: evaluation always runs the task itself."""
    env = OmegaConf.to_container(cfg.env, resolve=True)
    options = {k: v for k, v in env.items() if k not in PLUMBING_FIELDS}
    if evaluation and cfg.task in TASKS:
        # Set to their defaults, not dropped: RLlib merges an evaluation env_config into the
        # training one, so a missing key would keep its training value.
        options.update(TASKS[cfg.task].training_only_options())
    if "num_threads" in options:
        options["num_threads"] = physics_threads(cfg)
    if cfg.task not in TASKS:
        # Gymnasium ids: only gymnasium.make kwargs; raylab-only options do not apply.
        options = {}
    options.update(env.get("kwargs") or {})
    return options


def env_id_for_runner(cfg: DictConfig) -> str:
    """The id an EnvRunner hands to gymnasium.make_vec.

    ``module:id`` makes Gymnasium import the module first, which registers raylab's tasks in
    the EnvRunner's own process (a fresh Ray worker has not imported raylab.envs).
    """
    if cfg.task in TASKS or cfg.env.gym_id.startswith("raylab/"):
        return f"raylab.envs:{cfg.env.gym_id}"
    return cfg.env.gym_id


def resolve_num_gpus_per_learner(
    cfg: DictConfig, cluster_gpus: float, where: str = "this Ray cluster"
) -> float:
    """GPUs per Learner: the configured value, or 1 when the cluster has a GPU (null = auto);
    GPU-only options on CPU learners are refused here, where the device is known. ``where``
    names the cluster in the refusal ("this machine" before a local Ray starts)."""
    want = cfg.resources.num_gpus_per_learner
    if want is None:
        gpus = 1.0 if cluster_gpus >= 1 else 0.0
        check_device_options(cfg, gpus)
        return gpus
    check_device_options(cfg, float(want))
    if want > 0 and cluster_gpus < want * max(1, cfg.resources.num_learners):
        raise UserError(
            f"resources.num_gpus_per_learner={want} but {where} has {cluster_gpus:g} "
            "GPU(s); use resources.num_gpus_per_learner=0 (CPU) or null (auto)"
        )
    return float(want)


def check_device_options(cfg: DictConfig, num_gpus_per_learner: float) -> None:
    """GPU-only SAC options on a run whose learners are on CPU: refused, not ignored."""
    if cfg.algo.name != "sac" or num_gpus_per_learner > 0:
        return
    for key in ("torch_compile", "bf16_autocast"):
        if cfg.algo[key]:
            raise UserError(
                f"algo.{key}=true needs a GPU learner; this run's learners are on CPU "
                f"(resources.num_gpus_per_learner resolved to 0): use algo.{key}=false"
            )


def use_fast_sampler(cfg: DictConfig) -> bool:
    """Whether PPO / APPO EnvRunners use raylab's rollout loop (``training.fast_sampler``; its
    values are checked when the config is composed)."""
    want = cfg.training.fast_sampler
    return continuous_actions(cfg) if want is None else bool(want)


def continuous_actions(cfg: DictConfig) -> bool:
    """Whether the task's actions are a Box (every raylab task; a Gymnasium id is asked). An
    env that cannot be built here counts as not: RLlib's EnvRunners then build it and the run
    stops with its error, as for any env."""
    if cfg.task in TASKS:
        return True
    import gymnasium as gym

    try:
        env = gym.make(cfg.env.gym_id, **dict(cfg.env.kwargs or {}))
    except Exception:  # noqa: BLE001 - the EnvRunners build it again and report its error
        return False
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()


def build_algorithm_config(cfg: DictConfig, num_gpus_per_learner: float = 0.0):
    """The RLlib AlgorithmConfig for a composed raylab config."""
    from raylab.algorithms.callbacks import RaylabCallbacks
    from raylab.algorithms.env_runner import (
        RaylabEnvRunner,
        RaylabEvalEnvRunner,
        RaylabFastEnvRunner,
    )

    algo = cfg.algo
    builder = {"ppo": _ppo, "appo": _appo, "sac": _sac}[algo.name]
    config = builder(cfg)
    learner_extras = {}
    if algo.name in ("ppo", "appo"):
        learner_extras["policy_init"] = {
            "log_std": algo.init_log_std,
            "scale": algo.init_policy_scale,
            "orthogonal": bool(algo.get("orthogonal_init", False)),
        }
        learner_extras["adam_eps"] = float(algo.adam_eps)
        if algo.lr_schedule == "adaptive_kl":
            kl = algo.get("lr_kl_target")
            learner_extras["lr_kl_target"] = DEFAULT_LR_KL_TARGET if kl is None else float(kl)
    if algo.name == "ppo":
        learner_extras["update_threads"] = algo.learner_threads
    fast = use_fast_sampler(cfg)
    if cfg.algo.name == "sac":
        runner_cls = config.env_runner_cls  # SAC's transition path is always raylab's loop
    else:
        runner_cls = RaylabFastEnvRunner if fast else RaylabEnvRunner
    vector_mode = "vector_entry_point" if cfg.task in TASKS else "sync"
    config = (
        config.environment(env=env_id_for_runner(cfg), env_config=env_options(cfg))
        .env_runners(
            num_env_runners=cfg.resources.num_env_runners,
            num_envs_per_env_runner=cfg.env.num_envs,
            num_cpus_per_env_runner=cfg.resources.num_cpus_per_env_runner,
            custom_resources_per_env_runner=dict(cfg.resources.custom_resources_per_env_runner),
            gym_env_vectorize_mode=vector_mode,
            env_runner_cls=runner_cls,
        )
        .learners(
            num_learners=cfg.resources.num_learners,
            num_gpus_per_learner=num_gpus_per_learner,
            num_cpus_per_learner=(
                cfg.resources.num_cpus_per_learner if num_gpus_per_learner == 0 else 1
            ),
            custom_resources_per_learner=dict(cfg.resources.custom_resources_per_learner),
            learner_config_dict=learner_extras,
        )
        .resources(num_cpus_for_main_process=cfg.resources.num_cpus_for_main_process)
        .rl_module(**rl_module_options(cfg))
        .callbacks(RaylabCallbacks)
        .reporting(
            min_time_s_per_iteration=cfg.training.iteration_s,
            # raylab's reward window (raylab.algorithms.algorithm) takes its size from here.
            metrics_num_episodes_for_smoothing=cfg.training.reward_window,
        )
        .evaluation(**evaluation_options(cfg, RaylabEvalEnvRunner))
        .debugging(seed=cfg.training.seed, log_level="ERROR", log_sys_usage=False)
        .fault_tolerance(**env_runner_restarts(cfg), delay_between_env_runner_restarts_s=1.0)
    )
    config.raylab_eval_before_train = bool(cfg.training.eval_before_train)
    config.raylab_eval_background = bool(cfg.training.eval_background)
    config.raylab_eval_every = int(cfg.training.eval_every)
    config.raylab_episode_log = bool(cfg.training.episode_log)
    config.raylab_eval_seed = int(cfg.training.eval_seed)
    config.raylab_noise_correlation = float(cfg.algo.get("noise_correlation") or 0.0)
    return config


def rl_module_options(cfg: DictConfig) -> Dict[str, Any]:
    """The RLModule: RLlib's default MLP one, or raylab's (PPO / APPO) where an option needs it:
    ``env.privileged_obs`` (the asymmetric actor-critic whose policy does not see the
    privileged part), ``algo.max_log_std`` (a bounded policy std, ``algo.final_max_log_std``
    its schedule) or ``algo.normalize_obs``
    (running observation normalisation inside the module) or ``algo.scale_rewards`` (the return
    statistics the reward scaling keeps in the module)."""
    model_config = {
        "fcnet_hiddens": list(cfg.algo.hidden),
        "fcnet_activation": cfg.algo.activation,
        "vf_share_layers": False,
    }
    if cfg.algo.get("free_log_std", False):
        model_config["free_log_std"] = True
    if cfg.algo.name == "sac":
        model_config["log_std_min"] = float(cfg.algo.log_std_min)
        model_config["mean_bound"] = cfg.algo.mean_bound
    max_log_std = cfg.algo.get("max_log_std")
    normalize = bool(cfg.algo.get("normalize_obs", False))
    scale_rewards = bool(cfg.algo.get("scale_rewards", False))
    privileged = cfg.env.get("privileged_obs", False)
    if not privileged and max_log_std is None and not normalize and not scale_rewards:
        return {"model_config": model_config}
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from raylab.algorithms.modules import (
        ACTOR_OBS_DIM,
        FINAL_MAX_LOG_STD,
        MAX_LOG_STD,
        MODULES,
        NORMALIZE_OBS,
        SCALE_REWARDS,
        SCHEDULE_SECONDS,
        SCHEDULE_STEPS,
    )

    model_config[ACTOR_OBS_DIM] = actor_obs_dim(cfg) if privileged else None  # None: all
    model_config[MAX_LOG_STD] = max_log_std
    model_config[FINAL_MAX_LOG_STD] = cfg.algo.get("final_max_log_std")
    model_config[SCHEDULE_STEPS] = int(cfg.training.total_steps)
    model_config[SCHEDULE_SECONDS] = cfg.training.get("time_budget_s")  # None: steps only
    model_config[NORMALIZE_OBS] = normalize
    model_config[SCALE_REWARDS] = scale_rewards
    return {
        "rl_module_spec": RLModuleSpec(
            module_class=MODULES[cfg.algo.name], model_config=model_config
        )
    }


def actor_obs_dim(cfg: DictConfig) -> int:
    """How many leading observation entries the policy sees (the task's env says)."""
    import gymnasium as gym

    import raylab.envs  # noqa: F401

    options = {**env_options(cfg), "num_threads": 1}
    env = gym.make_vec(
        cfg.env.gym_id, num_envs=1, vectorization_mode="vector_entry_point", **options
    )
    try:
        return int(env.actor_obs_dim)
    finally:
        env.close()


def evaluation_options(cfg: DictConfig, runner_cls) -> Dict[str, Any]:
    """RLlib's evaluation settings for ``training.eval_*``: ``eval_episodes`` episodes every
    ``eval_every`` iterations, after the iteration's training, on the evaluation group's local
    EnvRunner (in the algorithm's process, which waits for the evaluation anyway: no extra
    actor or CPU reservation), without exploration."""
    t = cfg.training
    active = t.eval_every > 0 or t.eval_before_train
    # RLlib creates the evaluation group only for an interval: evaluating just the initial
    # policy takes one that never comes round. Beside training (training.eval_background) the
    # algorithm starts the evaluations itself (raylab.algorithms.algorithm), so RLlib's never
    # comes round either.
    interval = None if not active else NEVER if t.eval_background else int(t.eval_every) or NEVER
    return dict(
        evaluation_interval=interval,
        evaluation_duration=int(t.eval_episodes),
        evaluation_duration_unit="episodes",
        evaluation_num_env_runners=0,
        evaluation_parallel_to_training=False,
        evaluation_config={
            "explore": False,
            "env_config": env_options(cfg, evaluation=True),
            "env_runner_cls": runner_cls,
            "create_local_env_runner": True,
        }
        if active
        else None,
    )


# algo.lr_schedule=adaptive_kl: the KL per minibatch it aims at when algo.lr_kl_target is null.
DEFAULT_LR_KL_TARGET = 0.01


def learning_rate(cfg: DictConfig):
    """``algo.lr``, or with ``algo.lr_schedule=linear`` RLlib's piecewise-linear schedule from
    it down to 0 at ``training.total_steps`` (env steps sampled). With ``adaptive_kl`` the
    learner moves the rate from ``algo.lr`` on (``learners.adapt_lr_to_kl``)."""
    a = cfg.algo
    if a.lr_schedule == "linear":
        return [[0, float(a.lr)], [int(cfg.training.total_steps), 0.0]]
    return a.lr


def reward_scaling(a: DictConfig):
    """``algo.scale_rewards``: the learner connector piece that scales the rewards (placed in
    front of RLlib's default learner pipeline), else None."""
    if not a.scale_rewards:
        return None
    from raylab.algorithms.reward_scaling import ScaleRewardsByReturnStd

    gamma = float(a.gamma)
    return lambda *args, **kwargs: ScaleRewardsByReturnStd(gamma=gamma)


def _ppo(cfg: DictConfig):
    from ray.rllib.algorithms.ppo import PPOConfig

    from raylab.algorithms.learners import RaylabPPOLearner

    a = cfg.algo
    from raylab.algorithms.algorithm import RaylabPPO

    config = PPOConfig(algo_class=RaylabPPO).learners(
        learner_class=RaylabPPOLearner, learner_connector=reward_scaling(a)
    )
    return config.training(
        lr=learning_rate(cfg),
        gamma=a.gamma,
        lambda_=a.lambda_,
        clip_param=a.clip_param,
        vf_clip_param=a.vf_clip_param,
        vf_loss_coeff=a.vf_loss_coeff,
        entropy_coeff=a.entropy_coeff,
        use_kl_loss=a.kl_coeff > 0,
        kl_coeff=a.kl_coeff,
        kl_target=a.kl_target,
        grad_clip=a.grad_clip,
        train_batch_size_per_learner=a.train_batch_size,
        minibatch_size=a.minibatch_size,
        num_epochs=a.num_epochs,
    )


def _appo(cfg: DictConfig):
    from ray.rllib.algorithms.appo import APPOConfig

    from raylab.algorithms.learners import RaylabAPPOLearner

    a = cfg.algo
    from raylab.algorithms.algorithm import RaylabAPPO

    config = APPOConfig(algo_class=RaylabAPPO).learners(
        learner_class=RaylabAPPOLearner, learner_connector=reward_scaling(a)
    )
    config.training(
        lr=learning_rate(cfg),
        gamma=a.gamma,
        vtrace=a.vtrace,
        clip_param=a.clip_param,
        vf_loss_coeff=a.vf_loss_coeff,
        entropy_coeff=a.entropy_coeff,
        use_kl_loss=a.use_kl_loss,
        kl_coeff=a.kl_coeff,
        grad_clip=a.grad_clip,
        train_batch_size_per_learner=a.train_batch_size,
        circular_buffer_num_batches=a.circular_buffer_num_batches,
        circular_buffer_iterations_per_batch=a.circular_buffer_iterations_per_batch,
        target_network_update_freq=a.target_network_update_freq,
        broadcast_interval=a.broadcast_interval,
    )
    # Let the algorithm loop wait briefly for ready samples instead of spinning: on a small
    # machine a spinning driver takes a core from the EnvRunners and the Learner.
    config.timeout_s_sampler_manager = 0.02
    return config.env_runners(
        rollout_fragment_length=a.rollout_fragment_length,
        max_requests_in_flight_per_env_runner=a.sample_requests_in_flight,
    )


def env_runner_restarts(cfg: DictConfig) -> Dict[str, Any]:
    """RLlib's fault-tolerance options for ``training.max_env_runner_restarts`` (0: off)."""
    n = int(cfg.training.max_env_runner_restarts)
    return {"restart_failed_env_runners": n > 0, "max_num_env_runner_restarts": n}


def sac_training_kwargs(a) -> dict:
    """``SACConfig.training`` arguments from ``algo.*``: raylab's SAC and the stock RLlib SAC that
    benchmarks compare it with take the same ones."""
    return dict(
        gamma=a.gamma,
        actor_lr=a.actor_lr,
        critic_lr=a.critic_lr,
        alpha_lr=a.alpha_lr,
        tau=a.tau,
        initial_alpha=a.initial_alpha,
        target_entropy="auto" if a.target_entropy is None else a.target_entropy,
        n_step=1,
        grad_clip=a.grad_clip,
        train_batch_size_per_learner=a.batch_size,
        num_steps_sampled_before_learning_starts=a.learning_starts,
    )


def _sac(cfg: DictConfig):
    from raylab.algorithms.sac import RaylabSACConfig, RaylabSACEnvRunner

    a = cfg.algo
    config = RaylabSACConfig().training(**sac_training_kwargs(a))
    config.updates_per_step = a.updates_per_step
    config.weight_sync_every = a.weight_sync_every
    config.env_steps_per_sync = a.env_steps_per_sync
    config.buffer_capacity = a.buffer_capacity
    config.learning_starts = a.learning_starts
    config.torch_compile = a.torch_compile
    config.bf16_autocast = a.bf16_autocast
    config.critic_loss = a.critic_loss
    config.reward_scale = float(a.reward_scale)
    config.store_buffer_in_checkpoints = a.store_buffer_in_checkpoints
    config.split_update = a.split_update
    config.learner_torch_threads = max(
        1, int(a.learner_threads or cfg.resources.num_cpus_per_learner)
    )
    return config.env_runners(env_runner_cls=RaylabSACEnvRunner)
