"""End-to-end training throughput: ``raylab bench train --algo appo|sac|ppo``.

Each *run* builds the RLlib algorithm from the composed raylab config (``algorithms/build.py``,
exactly what ``raylab train`` builds), trains for ``--warmup`` seconds (and, for SAC, until the
first gradient update), then for a fixed budget of ``--seconds`` and reads:

- env steps per second: env steps sampled over the budget (RLlib's lifetime counter) / wall;
- learner updates per second: gradient steps over the budget (raylab SAC: the learner's own
  update counter; RLlib learners: rows trained / rows per gradient step);
- the per-phase share of the learner's iteration wall time, from the canonical metrics
  (``raylab.reporting.canonical_metrics`` on every result of the budget;
  ``LEARNER_MAIN_PHASES[algo]`` and Other = ``learner_other_s``).

Contenders, alternated run by run (order reversed every other round):

- ``batched``:  raylab's default path, the batched env (``vector_entry_point``) sampled by
  raylab's rollout loop (PPO / APPO: ``RaylabFastEnvRunner``; SAC: its transition loop);
- ``gym_sync``: stock RLlib: the same algorithm and config, the env created as Gymnasium's
  SyncVectorEnv of the reference env (``.env_runners(gym_env_vectorize_mode="sync")``, bench
  only) and, for PPO / APPO, sampled by RLlib's own EnvRunner loop;
- SAC only: ``stock_sac``, RLlib's own ``SACConfig`` (its default module, replay buffer and
  training step) with the same hyperparameters and replay ratio, on the batched env; and
  ``torch_limit``, the SAC update raylab ships (``sac_kernel.sac_update``) of the same network,
  batch size and settings, called in a plain loop in this process on the learner's thread
  count: the most updates/s the learner could do.

``--vary KEY=V1,V2`` runs each side once per value of one config key instead (alternating the
same way) and reports every value's rates against the first: what a setting costs, e.g.
``--vary training.iteration_s=1,5`` for the live panel's short iterations. Given more than once,
the keys change together (values paired in order), e.g. the same envs on one or two EnvRunners:
``--vary resources.num_env_runners=1,2 --vary env.num_envs=32,16``. Paired, a key may repeat a
value (``--vary resources.num_env_runners=1,2,2 --vary env.num_envs=128,64,128``); the variants
must differ.

A one-thread window of the batched env (``--ref-seconds``) before the first run and after every
run is the machine's reference; its drift and trend give the verdict, as in the env sweep.

``--physics-seconds S`` adds, next to every reference window, a window of the task's bare
physics (``raylab bench env --mode bare``: N envs x 10 ``mj_step`` with recorded servo targets,
nothing else) on all the machine's cores with the run's env count, that of all its EnvRunners
together (a variant with another env count gets a window of its own count before it). Each
training run's env steps per second over the mean of the physics windows before and after it,
both at its env count, is its ratio to bare physics (``<contender>_over_physics``): the share
of the machine's physics rate that training end to end keeps. Goals: APPO at least 0.70, PPO at
least 0.55 (PPO samples while nobody learns and learns while nobody samples).
"""

from __future__ import annotations

import copy
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from raylab.bench import common as C
from raylab.errors import UserError, choices_hint
from raylab.metrics import trace

ALGOS = ("appo", "sac", "ppo")
SIDES = ("batched", "gym_sync")
# Settings every benchmark run gets (no panel, no dashboard, no checkpoints in the way).
# Throughput runs evaluate nothing (an evaluation pauses the algorithm loop); a benchmark that
# wants it passes training.eval_every=N (later overrides win).
BENCH_OVERRIDES = (
    "resources.dashboard=false",
    "training.eval_every=0",
    "training.eval_before_train=false",
    # A benchmark does not restart lost EnvRunners; with restarts on, Ray's core worker in this
    # process (the bench builds the algorithm here, not in a Tune trial) prints an ERROR line
    # for every EnvRunner created with its config in the object store (raylab/quiet.py).
    "training.max_env_runner_restarts=0",
)
SETTLE_S = 2.0  # pause after a training run, before its reference window
# End to end, raylab's default path against stock RLlib (PPO / APPO): at least 2x.
GOALS = {"batched_over_gym_sync": 2.0, "sac_over_torch_limit": 0.6, "sac_over_stock": 4.0}
# End to end against the task's bare physics on all cores (--physics-seconds).
PHYSICS_GOALS = {"appo": 0.70, "ppo": 0.55}


def _say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------- plain torch


def torch_sac_update_rate(
    obs_dim: int,
    act_dim: int,
    hidden: Sequence[int],
    activation: str,
    batch_size: int,
    seconds: float,
    threads: int = 1,
    seed: int = 0,
    gamma: float = 0.99,
    tau: float = 0.005,
    grad_clip: Optional[float] = None,
    split: bool = False,
) -> Dict[str, float]:
    """Updates/s of the SAC update raylab ships (``raylab.algorithms.sac.update.sac_update``)
    called in a plain loop, with nothing of RLlib or Ray around it: the networks and the Adam
    optimizers the learner builds, batches gathered by random index from a preallocated pool as
    the device replay does, on ``threads`` torch threads (``split``: the actor's half of each
    update on a second thread, as ``algo.split_update``). The learner's rate over this one is
    what raylab's plumbing costs."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from raylab.algorithms.sac import update as K

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        pi = K.mlp(obs_dim, hidden, 2 * act_dim, activation)
        qf = K.mlp(obs_dim + act_dim, hidden, 1, activation)
        qf_twin = K.mlp(obs_dim + act_dim, hidden, 1, activation)
        log_alpha = torch.zeros(1, requires_grad=True)
        adam = {"lr": 3e-4, "fused": True, "eps": 1e-7}  # as the learner's optimizers
        parts = K.SACParts(
            pi=pi,
            qf=qf,
            qf_twin=qf_twin,
            target_qf=copy.deepcopy(qf),
            target_qf_twin=copy.deepcopy(qf_twin),
            log_alpha=log_alpha,
            optimizers=[
                torch.optim.Adam(list(qf.parameters()) + list(qf_twin.parameters()), **adam),
                torch.optim.Adam(pi.parameters(), **adam),
                torch.optim.Adam([log_alpha], **adam),
            ],
        )
        pool = 50_000
        data = {
            "obs": torch.randn(pool, obs_dim, generator=g),
            "actions": torch.rand(pool, act_dim, generator=g) * 2 - 1,
            "rewards": torch.randn(pool, generator=g),
            "next_obs": torch.randn(pool, obs_dim, generator=g),
            "terminateds": (torch.rand(pool, generator=g) < 0.01).float(),
        }
        target_entropy = -float(act_dim)

        def update():
            idx = torch.randint(0, pool, (batch_size,), generator=g)
            K.sac_update(
                parts,
                {k: v[idx] for k, v in data.items()},
                gamma=gamma,
                tau=tau,
                target_entropy=target_entropy,
                grad_clip=grad_clip,
                helper=helper,
            )

        helper = ThreadPoolExecutor(1, thread_name_prefix="sac-actor-half") if split else None
        for _ in range(10):
            update()
        w = C.run_window(update, seconds, 1)
        if helper is not None:
            helper.shutdown()
        return {
            "updates_per_s": w["rate"],
            "updates_per_cpu_s": w["cpu_rate"],
            "updates": w["calls"],
            "seconds": w["wall_s"],
            "threads": threads,
        }
    finally:
        torch.set_num_threads(old_threads)


# --------------------------------------------------------------------------- configs


def compose_cfg(algo: str, task: str, overrides: Sequence[str]):
    from raylab.config import compose

    if algo not in ALGOS:
        raise UserError(choices_hint(algo, ALGOS, "algo"))
    return compose(algo, task, "mujoco", [*BENCH_OVERRIDES, *overrides])


def algorithm_config(contender: str, cfg):
    """The RLlib AlgorithmConfig of one contender (raylab's own builder for the first two)."""
    from raylab.algorithms.build import build_algorithm_config

    if contender in SIDES:
        config = build_algorithm_config(cfg, num_gpus_per_learner=0.0)
        if contender == "gym_sync":
            config = config.env_runners(gym_env_vectorize_mode="sync")
            if cfg.algo.name != "sac":
                # Stock RLlib: its own EnvRunner loop, never raylab's rollout loop.
                from raylab.algorithms.env_runner import RaylabEnvRunner

                config = config.env_runners(env_runner_cls=RaylabEnvRunner)
        return config
    if contender == "stock_sac":
        return stock_sac_config(cfg)
    raise ValueError(contender)


def stock_sac_training_intensity(cfg) -> float:
    """RLlib's ``training_intensity`` that makes stock SAC do ``updates_per_step`` updates per
    sampled env step (RLlib divides it by a native ratio that counts a local EnvRunner)."""
    r = cfg.resources
    sampled_per_round = 1 * cfg.env.num_envs * max(1, r.num_env_runners)  # rollout length 1
    native = cfg.algo.batch_size / (1 * cfg.env.num_envs * max(r.num_env_runners + 1, 1))
    return float(cfg.algo.updates_per_step * sampled_per_round * native)


def stock_sac_config(cfg):
    from ray.rllib.algorithms.sac import SACConfig

    from raylab.algorithms.build import (
        env_id_for_runner,
        env_options,
        env_runner_restarts,
        sac_training_kwargs,
    )
    from raylab.envs.tasks import TASKS

    a, r = cfg.algo, cfg.resources
    config = (
        SACConfig()
        .environment(env=env_id_for_runner(cfg), env_config=env_options(cfg))
        .env_runners(
            num_env_runners=r.num_env_runners,
            num_envs_per_env_runner=cfg.env.num_envs,
            num_cpus_per_env_runner=r.num_cpus_per_env_runner,
            rollout_fragment_length=1,
            gym_env_vectorize_mode="vector_entry_point" if cfg.task in TASKS else "sync",
        )
        .learners(
            num_learners=r.num_learners,
            num_gpus_per_learner=0,
            num_cpus_per_learner=r.num_cpus_per_learner,
        )
        .training(
            **sac_training_kwargs(a),
            training_intensity=stock_sac_training_intensity(cfg),
            replay_buffer_config={"capacity": a.buffer_capacity},
        )
        .rl_module(model_config={"fcnet_hiddens": list(a.hidden), "fcnet_activation": a.activation})
        .reporting(
            min_time_s_per_iteration=cfg.training.iteration_s,
            metrics_num_episodes_for_smoothing=100,
            # iterations end on time, as raylab's SAC's do (stock: >= 100 env steps)
            min_sample_timesteps_per_iteration=0,
            min_train_timesteps_per_iteration=0,
        )
        .debugging(seed=cfg.training.seed, log_level="ERROR")
        .fault_tolerance(**env_runner_restarts(cfg))
    )
    return config


def rows_per_update(contender: str, cfg) -> int:
    """Rows of one gradient step of an RLlib learner (PPO: a minibatch; APPO: a train batch)."""
    a = cfg.algo
    if a.name == "ppo":
        return int(a.minibatch_size)
    if a.name == "appo":
        return int(a.train_batch_size)
    return int(a.batch_size)


# ------------------------------------------------------------------------------ a run


def _updates_and_rows(algo, contender: str, cfg, result: dict):
    """(gradient updates, rows trained) so far.

    raylab's learners count their own gradient steps. Stock RLlib's are estimated as rows
    trained / ``rows_per_update``, which holds only while a batch is ``train_batch_size`` rows:
    APPO packs whole ``sample()`` results into a batch until it reaches that size, so with
    ``num_envs * rollout_fragment_length`` above it a batch is one sample, and larger."""
    from raylab.reporting import _get

    if contender in SIDES and cfg.algo.name == "sac":
        status = algo._learner_call(lambda learner: learner.status())[0]
        return float(status["updates"]), float(status["updates"]) * cfg.algo.batch_size
    rows = _get(result, "learners", "__all_modules__", "num_module_steps_trained_lifetime")
    if not isinstance(rows, (int, float)):
        rows = _get(
            result, "learners", "__all_modules__", "num_env_steps_trained_lifetime", default=0
        )
    rows = float(rows or 0)
    if contender in SIDES:
        statuses = algo.learner_group.foreach_learner(lambda learner: learner.learner_status())
        statuses = [r.get() if hasattr(r, "get") else r for r in statuses]
        return float(sum(s["updates"] for s in statuses)), rows
    return rows / rows_per_update(contender, cfg), rows


def phase_shares(metrics: Sequence[Dict[str, float]], algo: str) -> Optional[Dict[str, Any]]:
    """Mean share of the learner's iteration wall per main phase (and Other), from canonical
    metrics (one dict per training result); None when the iteration wall was not measured."""
    from raylab.metrics import schema as S

    walls = [m[S.PERF_ITERATION_TIME] for m in metrics if S.PERF_ITERATION_TIME in m]
    if not walls:
        return None
    mean: Dict[str, float] = {S.PERF_ITERATION_TIME: float(np.mean(walls))}
    for tag in S.LEARNER_MAIN_PHASES[algo]:
        vals = [m[tag] for m in metrics if tag in m and S.PERF_ITERATION_TIME in m]
        if vals:
            mean[tag] = float(np.mean(vals))
    wall = mean[S.PERF_ITERATION_TIME]
    shares = {
        tag: S.to_seconds(tag, v) / wall for tag, v in mean.items() if tag != S.PERF_ITERATION_TIME
    }
    other = S.learner_other_s(mean, algo)
    shares["Other"] = (other or 0.0) / wall
    return {"iteration_time_s": wall, "shares": shares}


def _actor_pids(algo):
    """Process ids of the remote Learner and EnvRunner actors (empty lists when local)."""
    import os

    learners: List[int] = []
    if algo.learner_group.is_remote:
        for r in algo.learner_group.foreach_learner(lambda learner: os.getpid()):
            learners.append(int(r.get() if hasattr(r, "get") else r))
    runners = [
        int(p)
        for p in algo.env_runner_group.foreach_env_runner(
            lambda runner: os.getpid(), local_env_runner=False
        )
    ]
    return learners, runners


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, which only waits for its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Sequence[int], contender: str, timeout_s: float = 60.0) -> None:
    """Wait until a stopped run's actor processes have exited: Ray ends them after
    ``algo.stop()`` returns, and their exit (two EnvRunners take seconds) would otherwise
    fall into the next reference and physics windows and lower them."""
    t0 = time.perf_counter()
    said = False
    while any(_alive(p) for p in pids):
        waited = time.perf_counter() - t0
        if waited > timeout_s:
            _say(f"  {contender}: actor processes {pids} still run after {waited:.0f} s; going on")
            return
        if waited > 5 and not said:
            _say(f"  waiting for the actor processes of {contender} to exit ({pids})")
            said = True
        time.sleep(0.1)


def stop_algorithm(algo, contender: str, cfg) -> None:
    """Stop a contender's algorithm. raylab SAC's learners stop their update threads first
    (RLlib calls Learner.shutdown only for a local learner; a remote one would exit with its
    thread still running)."""
    if contender in SIDES and cfg.algo.name == "sac":
        algo.learner_group.foreach_learner(lambda learner: learner.shutdown())
    algo.stop()


def train_run(
    contender: str, cfg, seconds: float, warmup: float, max_warmup: float = 300.0
) -> Dict[str, Any]:
    """Build, warm up, train for ``seconds``; the run's rates and phase shares."""
    from raylab.metrics import schema as S
    from raylab.reporting import canonical_metrics, env_steps

    t_build = time.perf_counter()
    algo = algorithm_config(contender, cfg).build_algo()
    build_s = time.perf_counter() - t_build
    learner_pids: List[int] = []
    runner_pids: List[int] = []
    try:
        t_start = time.perf_counter()
        while True:
            result = algo.train()
            updates, _ = _updates_and_rows(algo, contender, cfg, result)
            elapsed = time.perf_counter() - t_start
            if elapsed >= warmup and updates > 0:
                break
            if elapsed > max_warmup:
                raise UserError(
                    f"bench train: {contender} made no learner update in {max_warmup:.0f} s of "
                    "warm-up; lower algo.learning_starts or raise --warmup"
                )
        learner_pids, runner_pids = _actor_pids(algo)
        c0 = [C.proc_cpu_seconds(p) for p in (*learner_pids, *runner_pids)]
        t0, s0 = time.perf_counter(), env_steps(result)
        u0, rows0 = _updates_and_rows(algo, contender, cfg, result)
        prev, metrics, iterations = result, [], 0
        while time.perf_counter() - t0 < seconds:
            result = algo.train()
            metrics.append(canonical_metrics(result, prev))
            prev = result
            iterations += 1
        wall = time.perf_counter() - t0
        s1 = env_steps(result)
        u1, rows1 = _updates_and_rows(algo, contender, cfg, result)
        c1 = [C.proc_cpu_seconds(p) for p in (*learner_pids, *runner_pids)]
    finally:
        stop_algorithm(algo, contender, cfg)
        wait_gone([*learner_pids, *runner_pids], contender)
    fps = [m[S.PERF_TOTAL_FPS] for m in metrics if S.PERF_TOTAL_FPS in m]
    collector = {}
    for tag in (S.PERF_COLLECTOR_ENV_STEP_MS, S.PERF_COLLECTOR_MLP_INFER_MS):
        vals = [m[tag] for m in metrics if tag in m]
        if vals:
            collector[tag] = float(np.mean(vals))
    cpu = [b - a for a, b in zip(c0, c1)]
    learner_cpu, runner_cpu = sum(cpu[: len(learner_pids)]), sum(cpu[len(learner_pids) :])
    return {
        "contender": contender,
        "env_steps_per_s": (s1 - s0) / wall,
        "updates_per_s": (u1 - u0) / wall,
        "rows_trained_per_s": (rows1 - rows0) / wall,
        "updates_per_env_step": (u1 - u0) / max(1, s1 - s0),
        "env_steps": s1 - s0,
        "updates": u1 - u0,
        "seconds": wall,
        "iterations": iterations,
        "build_s": build_s,
        "warmup_s": t0 - t_start,
        "total_fps_mean": float(np.mean(fps)) if fps else None,
        # CPU seconds of the remote Learner / EnvRunner actor processes over the budget (read
        # from /proc): the cost of the work, much less sensitive to other load than wall rates.
        "learner_cpu_s": learner_cpu if learner_pids else None,
        "env_runner_cpu_s": runner_cpu if runner_pids else None,
        "updates_per_learner_cpu_s": (u1 - u0) / learner_cpu
        if learner_pids and learner_cpu > 0
        else None,
        "env_steps_per_runner_cpu_s": (s1 - s0) / runner_cpu
        if runner_pids and runner_cpu > 0
        else None,
        "phases": phase_shares(metrics, cfg.algo.name) if contender in SIDES else None,
        "collector_ms": collector,
    }


# ------------------------------------------------------------------------------ bench


def run_train_bench(
    algo: str = "appo",
    task: str = "microduck_balance",
    overrides: Sequence[str] = (),
    seconds: float = 60.0,
    warmup: float = 20.0,
    rounds: int = 1,
    sides: Sequence[str] = SIDES,
    stock_sac: bool = True,
    torch_limit_s: float = 10.0,
    ref_seconds: float = 3.0,
    drift_limit: float = C.DRIFT_LIMIT,
    trend_limit: float = C.TREND_LIMIT,
    vary: Optional[str] = None,
    command: str = "",
    physics_seconds: float = 0.0,
) -> Dict[str, Any]:
    from raylab.algorithms.build import physics_threads
    from raylab.envs.tasks import TASKS

    cfg = compose_cfg(algo, task, overrides)
    variants = parse_vary(vary)
    # One config per variant value (each checked now, before anything runs).
    cfg_of = {v: compose_cfg(algo, task, [*overrides, *v.split(" ")]) for v in variants}
    import ray  # noqa: F401  (imported before the result is opened: its version is recorded)
    import torch  # noqa: F401

    for s in sides:
        if s not in SIDES:
            raise UserError(choices_hint(s, SIDES, "side"))
    if task not in TASKS and "batched" in sides:
        raise UserError(f"task '{task}' has no batched env; use --sides gym_sync")
    contenders = list(sides)
    if variants:
        # The same sides, once per value of the varied key; nothing else (stock SAC and the
        # plain-torch limit do not depend on raylab's config).
        contenders = [f"{s}@{v}" for v in variants for s in sides]
    elif algo == "sac":
        if stock_sac:
            contenders.append("stock_sac")
        if torch_limit_s > 0:
            contenders.append("torch_limit")
    params = dict(
        algo=algo,
        task=task,
        overrides=list(overrides),
        seconds=seconds,
        warmup_s=warmup,
        rounds=rounds,
        contenders=contenders,
        torch_limit_s=torch_limit_s,
        ref_seconds=ref_seconds,
        num_envs=cfg.env.num_envs,
        num_threads=physics_threads(cfg),
        num_env_runners=cfg.resources.num_env_runners,
        num_learners=cfg.resources.num_learners,
        hidden=list(cfg.algo.hidden),
        vary=variants,
        physics_seconds=physics_seconds,
    )
    if algo == "sac":
        params["stock_sac_training_intensity"] = stock_sac_training_intensity(cfg)
    rc = cfg.resources
    check = C.machine_check(1 + rc.num_env_runners * physics_threads(cfg) + max(1, rc.num_learners))
    C.print_check(check)
    result = C.new_result("train", command, params, check)

    from raylab.bench.env import env_tasks, make_batched
    from raylab.train import init_ray

    ref = None
    if ref_seconds > 0 and task in env_tasks():
        ref = make_batched(task, 16, 1, 0, {})
        ref.window(0.5)
    if physics_seconds > 0:
        if task not in env_tasks():
            raise UserError(f"--physics-seconds: task '{task}' has no batched env to time")
        cores = C.usable_cores()
        result["params"]["physics_threads"] = cores
    refs: List[Dict[str, Any]] = []
    physics_windows: List[Dict[str, Any]] = []
    # Bare physics at each run's own env count (a --vary of env.num_envs times each count's):
    # one window before the first run and after every run, plus one before a run whose count
    # differs from the window just taken.
    physics: Dict[int, Any] = {}

    def envs_of(name: str) -> int:  # a contender's envs, all EnvRunners ("side@variant#round")
        c = cfg_of.get(name.partition("#")[0].partition("@")[2], cfg)
        return int(c.env.num_envs) * max(1, int(c.resources.num_env_runners))

    def physics_window(n: int, **where):
        if n not in physics:
            physics[n] = make_batched(task, n, C.usable_cores(), 0, {}, mode="bare")
            physics[n].window(0.5)
        w = physics[n].window(physics_seconds)
        physics_windows.append({**where, "num_envs": n, "env_steps_per_s": w["rate"]})
        _say(f"  bare physics ({physics[n].name}, {n} envs) {w['rate']:,.0f} env-steps/s")

    def before_run(name: str):
        if physics_seconds > 0 and name != "torch_limit":
            n = envs_of(name)
            if not physics_windows or physics_windows[-1]["num_envs"] != n:
                physics_window(n, before_run=name)

    def measure_ref(after: Optional[str]):
        if physics_seconds > 0:
            n = envs_of(after) if after and not after.startswith("torch_limit") else None
            if n is None:
                n = physics_windows[-1]["num_envs"] if physics_windows else envs_of(contenders[0])
            prior = physics_windows[-1] if physics_windows else None
            physics_window(n, after_run=after)
            if after is not None and runs and runs[-1].get("env_steps_per_s"):
                # this run against the physics windows on either side of it (same env count)
                both = [prior["env_steps_per_s"], physics_windows[-1]["env_steps_per_s"]]
                runs[-1]["physics_env_steps_per_s"] = float(np.mean(both))
                runs[-1]["over_physics"] = runs[-1]["env_steps_per_s"] / float(np.mean(both))
        if ref is not None:
            w = ref.window(ref_seconds)
            refs.append(
                {
                    "after_run": after,
                    "env_steps_per_s": w["rate"],
                    "env_steps_per_cpu_s": w["cpu_rate"],
                }
            )
            _say(f"  reference (batched env, 1 thread, 16 envs) {w['rate']:,.0f} env-steps/s")

    runs: List[Dict[str, Any]] = []
    started_ray = not ray.is_initialized()
    try:
        init_ray(largest(cfg, cfg_of.values()))
        measure_ref(None)
        space = _spaces(cfg)
        for r, name in C.round_order(contenders, rounds):
            if name == "torch_limit":
                from raylab.algorithms.sac.learner import split_update_on
                from raylab.envs.core.backend import usable_cores

                out = {
                    "contender": name,
                    **torch_sac_update_rate(
                        space[0],
                        space[1],
                        list(cfg.algo.hidden),
                        cfg.algo.activation,
                        cfg.algo.batch_size,
                        torch_limit_s,
                        threads=max(1, int(cfg.resources.num_cpus_per_learner)),
                        gamma=cfg.algo.gamma,
                        tau=cfg.algo.tau,
                        grad_clip=cfg.algo.grad_clip,
                        split=split_update_on(
                            cfg.algo.split_update,
                            cuda=False,
                            world=max(1, int(cfg.resources.num_learners)),
                            cores=usable_cores(),
                        ),
                    ),
                }
                out["env_steps_per_s"] = None
                _say(
                    f"  round {r}  torch_limit {out['updates_per_s']:,.1f} updates/s "
                    f"({out['threads']} torch thread(s), the learner's)"
                )
            else:
                before_run(name)
                side, _, variant = name.partition("@")
                out = train_run(side, cfg_of.get(variant, cfg), seconds, warmup)
                out["contender"] = name
                _say(
                    f"  round {r}  {name:<11} {out['env_steps_per_s']:,.1f} env-steps/s, "
                    f"{out['updates_per_s']:,.1f} updates/s over {out['seconds']:.0f} s "
                    f"({out['iterations']} iterations; build {out['build_s']:.0f} s, "
                    f"warm-up {out['warmup_s']:.0f} s)"
                )
            out["round"] = r
            runs.append(out)
            if name != "torch_limit":
                time.sleep(SETTLE_S)  # let the stopped actors' processes exit
            measure_ref(f"{name}#{r}")
    finally:
        for c in (ref, *physics.values()):
            if c is not None:
                c.close()
        if started_ray and ray.is_initialized():
            ray.shutdown()

    result["runs"] = runs
    result["refs"] = refs
    result["physics_windows"] = physics_windows
    result["summary"] = _summarise(runs, contenders, algo, variants)
    if refs:
        g = C.guard([x["env_steps_per_s"] for x in refs], drift_limit, trend_limit)
        for x, d in zip(refs, g["drifts"]):
            x["drift"] = d
    else:
        g = C.guard([], drift_limit, trend_limit)
    return C.finish_result(result, g["verdict"], g)


def largest(cfg, variants):
    """The config a local Ray is started with: the one whose actors reserve the most CPUs
    (a Ray sized for the first variant of a --vary of the EnvRunners or the learner's CPUs
    could not place the others' actors, which would wait forever)."""
    from raylab.train import cpus_reserved

    return max([cfg, *variants], key=cpus_reserved)


def _spaces(cfg):
    """(obs_dim, action_dim) of the task, from one reference env."""
    import gymnasium as gym

    import raylab.envs  # noqa: F401

    env = gym.make(cfg.env.gym_id)
    try:
        return int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape))
    finally:
        env.close()


def parse_vary(vary) -> List[str]:
    """``KEY=V1,V2,...`` -> ``["KEY=V1", "KEY=V2", ...]`` (two values at least); None -> [].

    Several ``KEY=...`` (a list: ``--vary`` given more than once) change together: their values
    are paired in order (as many values each), and a variant is their overrides joined by a
    space, e.g. ``["resources.num_env_runners=1 env.num_envs=32", ...]``."""
    if not vary:
        return []
    if not isinstance(vary, str):
        if len(vary) == 1:
            return parse_vary(vary[0])
        # Paired keys: one of them may repeat a value (env.num_envs=64,128 beside
        # resources.num_env_runners=2,2); the variants themselves must differ.
        each = [_vary_values(v, distinct=False) for v in vary]
        if len({len(e) for e in each}) != 1:
            raise UserError(
                "--vary given more than once: every key needs as many values (they change "
                f"together), got {', '.join(str(len(e)) for e in each)}"
            )
        variants = [" ".join(group) for group in zip(*each)]
        if len(set(variants)) < len(variants):
            raise UserError(
                f"--vary {' --vary '.join(vary)}: two variants are the same "
                f"({', '.join(variants)}); every pairing must differ"
            )
        return variants
    return _vary_values(vary, distinct=True)


def _split_top_level(values: str) -> List[str]:
    """Split at the commas outside brackets: ``[256,256],[128,128]`` -> two list values."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(values):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(values[start:i])
            start = i + 1
    return [*parts, values[start:]]


def _vary_values(vary: str, distinct: bool) -> List[str]:
    key, eq, values = vary.partition("=")
    vals = [v.strip() for v in _split_top_level(values) if v.strip()]
    if not eq or not key.strip() or len(vals) < 2 or (distinct and len(set(vals)) < len(vals)):
        what = "different values" if distinct else "values"
        raise UserError(
            f"--vary {vary!r}: expected KEY=V1,V2[,...] with two or more {what}, "
            "e.g. --vary training.iteration_s=1,5"
        )
    return [f"{key.strip()}={v}" for v in vals]


def _summarise(
    runs: List[Dict[str, Any]], contenders: Sequence[str], algo: str, variants: Sequence[str] = ()
) -> Dict[str, Any]:
    def med(name, key):
        vals = [r[key] for r in runs if r["contender"] == name and r.get(key) is not None]
        return float(np.median(vals)) if vals else None

    def per_round_ratio(a, b, key):
        by_round: Dict[int, Dict[str, float]] = {}
        for r in runs:
            if r.get(key) is not None:
                by_round.setdefault(r["round"], {})[r["contender"]] = r[key]
        ratios = [d[a] / d[b] for d in by_round.values() if a in d and b in d and d[b] > 0]
        return (float(np.median(ratios)) if ratios else None), ratios

    out: Dict[str, Any] = {
        "median": {
            c: {
                "env_steps_per_s": med(c, "env_steps_per_s"),
                "updates_per_s": med(c, "updates_per_s"),
            }
            for c in contenders
        },
        "ratios": {},
        "goals": {},
    }
    for c in contenders:
        per = [r["over_physics"] for r in runs if r["contender"] == c and "over_physics" in r]
        if per:
            out["ratios"][f"{c}_over_physics"] = float(np.median(per))
            out["ratios"][f"{c}_over_physics_per_round"] = per
            goal = PHYSICS_GOALS.get(algo)
            if c.partition("@")[0] == "batched" and goal is not None:
                out["goals"][f"{algo}_{c}_ge_{goal:g}x_physics"] = float(np.median(per)) >= goal
    if variants:
        # Every value against the first, per side: env steps and updates per second.
        for side in dict.fromkeys(c.partition("@")[0] for c in contenders):
            base = f"{side}@{variants[0]}"
            for v in variants[1:]:
                for key, short in (("env_steps_per_s", "env_steps"), ("updates_per_s", "updates")):
                    r, per = per_round_ratio(f"{side}@{v}", base, key)
                    out["ratios"][f"{side}@{v}_over_{variants[0]}_{short}"] = r
                    out["ratios"][f"{side}@{v}_over_{variants[0]}_{short}_per_round"] = per
        return out
    if "batched" in contenders and "gym_sync" in contenders:
        v, per = per_round_ratio("batched", "gym_sync", "env_steps_per_s")
        out["ratios"]["batched_over_gym_sync_env_steps"] = v
        out["ratios"]["batched_over_gym_sync_env_steps_per_round"] = per
        if algo in ("appo", "ppo") and v is not None:
            goal = GOALS["batched_over_gym_sync"]
            out["goals"][f"{algo}_batched_ge_{goal:g}x_gym_sync"] = v >= goal
    if algo == "sac" and "batched" in contenders:
        if "stock_sac" in contenders:
            v, per = per_round_ratio("batched", "stock_sac", "env_steps_per_s")
            u, _ = per_round_ratio("batched", "stock_sac", "updates_per_s")
            out["ratios"]["sac_over_stock_env_steps"] = v
            out["ratios"]["sac_over_stock_env_steps_per_round"] = per
            out["ratios"]["sac_over_stock_updates"] = u
            if v is not None:
                out["goals"]["sac_ge_4x_stock"] = v >= GOALS["sac_over_stock"]
        if "torch_limit" in contenders:
            v, per = per_round_ratio("batched", "torch_limit", "updates_per_s")
            out["ratios"]["sac_over_torch_limit_updates"] = v
            out["ratios"]["sac_over_torch_limit_updates_per_round"] = per
            cpu = [
                r["updates_per_learner_cpu_s"]
                for r in runs
                if r["contender"] == "batched" and r.get("updates_per_learner_cpu_s")
            ]
            lim = [r["updates_per_cpu_s"] for r in runs if r["contender"] == "torch_limit"]
            if cpu and lim:
                # per CPU second: the learner process (update + request threads) against the
                # plain update; robust to other load, which wall rates are not
                out["ratios"]["sac_over_torch_limit_updates_per_cpu_s"] = float(
                    np.median(cpu) / np.median(lim)
                )
            if v is not None:
                out["goals"]["sac_ge_0.6x_torch_limit"] = v >= GOALS["sac_over_torch_limit"]
    return out


# ------------------------------------------------------------------------- sampler only

SAMPLER_CONTENDERS = ("fast", "rllib", "env")
TRACED = "fast_traced"
GOAL_SAMPLER_OVER_ENV = 0.85
GOAL_TRACE_OVERHEAD = 0.03  # tracing costs the collector under 3%


def run_sampler_bench(
    algo: str,
    task: str,
    overrides: Sequence[str],
    seconds: float,
    rounds: int,
    command: str = "",
    with_trace: bool = False,
) -> Dict[str, Any]:
    """EnvRunner sampling without a learner, in this process, alternating windows of:

    - ``fast``: raylab's EnvRunner (``RaylabFastEnvRunner``): policy forward, action sampling
      and the batched env, ``sample()`` of one rollout fragment per call;
    - ``rllib``: RLlib's own EnvRunner loop (``RaylabEnvRunner``) on the same batched env and
      module;
    - ``env``: the batched env alone with uniform random actions (no policy): the ceiling;
    - ``fast_traced`` (``with_trace``): raylab's EnvRunner again with this process's tracer on
      (``training.trace_enabled``: every vector step writes its MLP Infer / Env Step events and
      Env Step's nested parts), into a temporary folder: what tracing costs the collector.

    All at the same N envs and physics threads (``env.num_threads``, auto by default). Rates are
    env steps (transitions) per wall second; ratios are taken per round (adjacent windows)."""
    from raylab.algorithms.build import build_algorithm_config, env_options, physics_threads
    from raylab.algorithms.env_runner import RaylabEnvRunner, RaylabFastEnvRunner
    from raylab.bench.env import make_batched
    from raylab.envs.tasks import TASKS

    if algo not in ("ppo", "appo"):
        raise UserError(f"--sampler measures the PPO / APPO EnvRunners; got --algo {algo}")
    if task not in TASKS:
        raise UserError(
            choices_hint(task, list(TASKS), "task") + " (--sampler needs a raylab task)"
        )
    cfg = compose_cfg(algo, task, overrides)
    if cfg.training.trace_enabled:
        raise UserError(
            "training.trace_enabled=true: --sampler runs untraced contenders; add --trace for "
            "a traced one beside them"
        )
    contenders = SAMPLER_CONTENDERS
    if with_trace:  # next to its untraced self, so the pair's windows are adjacent
        contenders = ("fast", TRACED, *SAMPLER_CONTENDERS[1:])
    n, threads = int(cfg.env.num_envs), physics_threads(cfg)
    frag = int(cfg.algo.rollout_fragment_length) if algo == "appo" else 32
    config = build_algorithm_config(cfg).env_runners(rollout_fragment_length=frag)
    check = C.machine_check(threads)  # this process alone: the runner's or the env's threads
    C.print_check(check)
    params = dict(
        algo=algo,
        task=task,
        overrides=list(overrides),
        seconds=seconds,
        rounds=rounds,
        num_envs=n,
        num_threads=threads,
        rollout_fragment_length=frag,
        contenders=list(contenders),
    )
    result = C.new_result("sampler", command, params, check)
    options = {
        k: v for k, v in env_options(cfg).items() if k not in ("num_threads", "allow_overcommit")
    }
    runners = {
        "fast": RaylabFastEnvRunner(config=config, worker_index=1),
        "rllib": RaylabEnvRunner(config=config, worker_index=1),
    }
    env = make_batched(task, n, threads, 0, options)
    counted = {"steps": 0}

    def sampler(runner):
        def step():
            counted["steps"] += sum(len(e) for e in runner.sample(num_timesteps=frag * n))

        return step

    rows = []
    trace_dir = tempfile.mkdtemp(prefix="raylab-sampler-trace-") if with_trace else None
    trace_events = 0
    try:
        for runner in runners.values():
            runner.sample(num_timesteps=frag * n)  # warm-up: first reset, first forward
        env.window(0.5)
        for r, name in C.round_order(contenders, rounds):
            if name == "env":
                w = env.window(seconds)
                rate, cpu_rate = w["rate"], w["cpu_rate"]
            else:
                counted["steps"] = 0
                if name == TRACED:  # the same runner; its rollout loop reads trace.active()
                    trace.configure({"dir": trace_dir}, f"sampler-{r}", "sampler bench")
                runner = runners["fast" if name == TRACED else name]
                try:
                    w = C.run_window(sampler(runner), seconds, 1)
                finally:
                    if name == TRACED:
                        trace_events += trace.active().events
                        trace.shutdown()
                rate = counted["steps"] / w["wall_s"]
                cpu_rate = counted["steps"] / w["cpu_s"] if w["cpu_s"] > 0 else float("nan")
            rows.append(
                {
                    "contender": name,
                    "round": r,
                    "env_steps_per_s": rate,
                    "env_steps_per_cpu_s": cpu_rate,
                    "wall_s": w["wall_s"],
                }
            )
            _say(f"  round {r}  {name:<6} {rate:,.0f} env-steps/s ({cpu_rate:,.0f} per CPU-s)")
    finally:
        env.close()
        for runner in runners.values():
            runner.stop()
        if trace_dir is not None:
            trace.shutdown()
            shutil.rmtree(trace_dir, ignore_errors=True)
    result["rows"] = rows

    def by(name, r):
        return next(
            x["env_steps_per_s"] for x in rows if x["contender"] == name and x["round"] == r
        )

    pairs = [("fast", "env"), ("fast", "rllib"), ("rllib", "env")]
    if with_trace:
        pairs.append((TRACED, "fast"))
    ratios = {}
    for a, b in pairs:
        per = [by(a, r) / by(b, r) for r in range(rounds)]
        ratios[f"{a}_over_{b}"] = float(np.median(per))
        ratios[f"{a}_over_{b}_per_round"] = per
    result["ratios"] = ratios
    result["goals"] = {"fast_ge_0.85x_env": ratios["fast_over_env"] >= GOAL_SAMPLER_OVER_ENV}
    if with_trace:
        steps = sum(x["env_steps_per_s"] * x["wall_s"] for x in rows if x["contender"] == TRACED)
        result["trace_events_per_vector_step"] = trace_events / max(1.0, steps / n)
        result["goals"][f"trace_overhead_lt_{GOAL_TRACE_OVERHEAD:.0%}"] = (
            ratios[f"{TRACED}_over_fast"] > 1.0 - GOAL_TRACE_OVERHEAD
        )
    # The env-alone windows are the reference: their spread says how steady the machine was.
    guard_info = C.guard([by("env", r) for r in range(rounds)])
    return C.finish_result(result, guard_info["verdict"], guard_info)


def print_sampler(res: Dict[str, Any]) -> None:
    for k, v in res["ratios"].items():
        if not k.endswith("_per_round"):
            per = ", ".join(f"{x:.3f}" for x in res["ratios"][k + "_per_round"])
            print(f"{k}: {v:.3f} (rounds: {per})")
    if "trace_events_per_vector_step" in res:
        print(f"trace events per vector step: {res['trace_events_per_vector_step']:.1f}")
    for k, v in res["goals"].items():
        print(f"goal {k}: {'met' if v else 'NOT met'}")
    p = res["params"]
    print(
        f"N = {p['num_envs']}, T = {p['num_threads']}, fragment {p['rollout_fragment_length']}; "
        f"verdict: {res['verdict']}; load average before "
        f"{res['machine_check']['loadavg'][0]:.2f}, after {res['loadavg_after'][0]:.2f}, "
        f"{res['machine']['usable_cores']} core(s)"
    )


# -------------------------------------------------------------------------------- CLI


def parser():
    p = C.BenchParser(
        prog="raylab bench train",
        description="End-to-end training env-steps/s and learner updates/s over a fixed budget: "
        "raylab's batched env against RLlib on Gymnasium's SyncVectorEnv of the reference env "
        "(same algorithm and config), alternating runs; per-phase share of the learner's "
        "iteration wall from the canonical metrics. SAC adds stock RLlib SAC and a plain-torch "
        "update limit.",
        formatter_class=C.BenchFormatter,
        epilog="config overrides (KEY=VALUE) are those of `raylab train` (see `raylab train "
        "--help`); every run also gets: " + " ".join(BENCH_OVERRIDES),
    )
    p.add_argument("--algo", default="appo", help=f"algorithm: {', '.join(ALGOS)}")
    p.add_argument(
        "--task",
        default="microduck_balance",
        help="task (a raylab task for the batched side; any Gymnasium id with --sides gym_sync)",
    )
    p.add_argument(
        "--seconds",
        type=C.positive(float, "seconds"),
        default=60.0,
        help="measured training budget per run (wall seconds after the warm-up)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="seconds of training before the budget starts (SAC: also until the first update)",
    )
    p.add_argument(
        "--rounds",
        type=C.positive(int, "rounds"),
        default=1,
        help="runs per contender; the order is reversed every other round",
    )
    p.add_argument(
        "--sides", nargs="+", default=list(SIDES), help=f"env sides to run: {', '.join(SIDES)}"
    )
    p.add_argument("--no-stock-sac", action="store_true", help="SAC: skip the stock RLlib SAC run")
    p.add_argument(
        "--torch-limit-seconds",
        type=float,
        default=10.0,
        help="SAC: seconds of the plain-torch update timing per round (0: skip)",
    )
    p.add_argument(
        "--ref-seconds",
        type=float,
        default=3.0,
        help="seconds of the one-thread batched-env reference window before the "
        "first run and after every run (0: none; the verdict is then unchecked)",
    )
    p.add_argument(
        "--physics-seconds",
        type=float,
        default=None,
        help="seconds of a bare-physics window (the task's physics alone, all cores, the run's "
        "env count) before the first run and after every run; each run's env-steps/s over the "
        "windows on either side of it is its ratio to physics (default: 5 for raylab tasks, "
        "0 = none for Gymnasium ids)",
    )
    p.add_argument(
        "--drift-limit",
        type=float,
        default=C.DRIFT_LIMIT,
        help="unstable when a reference differs from the first by more than this",
    )
    p.add_argument(
        "--trend-limit",
        type=float,
        default=C.TREND_LIMIT,
        help="trending when 3 consecutive references move one way by more than this",
    )
    p.add_argument(
        "--vary",
        default=None,
        action="append",
        metavar="KEY=V1,V2",
        help="run each side once per value of one config key, alternating, and "
        "report each value's rates against the first (e.g. training.iteration_s=1,5); "
        "given more than once, the keys change together, their values paired in order "
        "(e.g. --vary resources.num_env_runners=1,2 --vary env.num_envs=32,16; a paired key "
        "may repeat a value, the variants must differ); a list value in brackets, without "
        "spaces (algo.hidden=[256,256],[128,128]); no stock SAC or torch limit then",
    )
    p.add_argument(
        "--sampler",
        action="store_true",
        help="PPO / APPO: measure EnvRunner sampling alone (no learner, no Ray) in "
        "alternating windows: raylab's EnvRunner, RLlib's EnvRunner loop, and the "
        "batched env with random actions, at the same envs and threads (--seconds "
        "per window; --rounds)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="with --sampler: add raylab's EnvRunner with tracing on (training.trace_enabled) "
        "as a fourth contender: what tracing costs the collector",
    )
    p.add_argument(
        "--out",
        default=None,
        help="result JSON; None: runs/bench/train_<algo>.json (--sampler: "
        "runs/bench/sampler_<algo>.json)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="raylab config overrides for every run, e.g. env.num_envs=32",
    )
    return p


# Options of the end-to-end runs that --sampler has no use for (refused there, not ignored).
END_TO_END_ONLY = (
    "warmup",
    "sides",
    "no_stock_sac",
    "torch_limit_seconds",
    "ref_seconds",
    "physics_seconds",
    "drift_limit",
    "trend_limit",
    "vary",
)


def default_physics_seconds(task: str) -> float:
    """5-second physics windows for a raylab task (it has a batched env); none otherwise."""
    from raylab.bench.env import env_tasks

    return 5.0 if task in env_tasks() else 0.0


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    command = C.command_line("raylab bench train", argv)
    print(command, flush=True)
    if args.trace and not args.sampler:
        raise UserError(
            "--trace adds a traced contender to --sampler; end to end, use "
            "--vary training.trace_enabled=false,true"
        )
    if args.sampler:
        defaults = parser().parse_args([])
        ignored = [
            "--" + k.replace("_", "-")
            for k in END_TO_END_ONLY
            if getattr(args, k) != getattr(defaults, k)
        ]
        if ignored:
            raise UserError(
                f"{', '.join(ignored)}: end-to-end options, not used by --sampler (which takes "
                "--algo, --task, --seconds, --rounds, --trace, --out and config overrides)"
            )
        res = run_sampler_bench(
            args.algo,
            args.task,
            args.overrides,
            args.seconds,
            args.rounds,
            command=command,
            with_trace=args.trace,
        )
        print_sampler(res)
        path = C.save_result(res, args.out or f"runs/bench/sampler_{args.algo}.json")
        print(f"wrote {path}")
        return 0
    res = run_train_bench(
        algo=args.algo,
        task=args.task,
        overrides=args.overrides,
        seconds=args.seconds,
        warmup=args.warmup,
        rounds=args.rounds,
        sides=args.sides,
        stock_sac=not args.no_stock_sac,
        torch_limit_s=args.torch_limit_seconds,
        ref_seconds=args.ref_seconds,
        drift_limit=args.drift_limit,
        trend_limit=args.trend_limit,
        vary=args.vary,
        command=command,
        physics_seconds=default_physics_seconds(args.task)
        if args.physics_seconds is None
        else args.physics_seconds,
    )
    print_train(res)
    path = C.save_result(res, args.out or f"runs/bench/train_{args.algo}.json")
    print(f"wrote {path}")
    return 0


def print_train(res: Dict[str, Any]) -> None:
    s = res["summary"]
    width = max(12, *(len(n) for n in s["median"]))
    print(f"{'contender':<{width}} {'env-steps/s':>12} {'updates/s':>10}   (median over rounds)")
    for name, m in s["median"].items():
        es = "-" if m["env_steps_per_s"] is None else f"{m['env_steps_per_s']:,.1f}"
        up = "-" if m["updates_per_s"] is None else f"{m['updates_per_s']:,.1f}"
        print(f"{name:<{width}} {es:>12} {up:>10}")
    for k, v in s["ratios"].items():
        if not k.endswith("_per_round") and v is not None:
            print(f"{k}: {v:.2f}")
    for k, v in s["goals"].items():
        print(f"goal {k}: {'met' if v else 'NOT met'}")
    for run in res["runs"]:
        ph = run.get("phases")
        if ph:
            parts = ", ".join(f"{t.split('/')[-1]} {v:.0%}" for t, v in ph["shares"].items())
            ms = ph["iteration_time_s"] * 1000
            print(f"phases {run['contender']}#{run['round']} (iteration {ms:.1f} ms): {parts}")
    g = res["guard"]
    load = res["machine_check"]["loadavg"][0]
    print(
        f"verdict: {res['verdict']} (max reference drift {g['max_abs_drift']:.1%}); load average "
        f"before {load:.2f}, after {res['loadavg_after'][0]:.2f}, "
        f"{res['machine']['usable_cores']} core(s)"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
