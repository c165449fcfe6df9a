"""`raylab tune FILE.yaml`: a Ray Tune hyperparameter sweep over raylab config keys.

The YAML names the algorithm, task and sim, base overrides for every trial, a search space over
raylab config keys (choice, uniform, loguniform, randint, grid), a scheduler (ASHA by default)
on a canonical metric, the number of samples, concurrency and a per-trial budget. Each trial
is one RLlib Algorithm composed from the base config plus its sampled overrides, runs through
the same Tune callback as `raylab train`, and gets its own run directory
(``<sweep>/trials/<trial_id>/``: events, run_config.json, run_summary.json). At the end the
sweep writes ``sweep_summary.json`` / ``.csv`` (best config, metric per trial).
``--resume`` restores an interrupted sweep from ``<sweep>/tune``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import OmegaConf

from raylab.config import compose, iter_keys, to_dict
from raylab.errors import UserError, choices_hint
from raylab.metrics import schema as S

SAMPLED_KEY = "raylab_sampled"
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint", "grid")
SCHEDULERS = ("asha", "fifo")
# The metrics a sweep ranks trials by. Eval/mean_reward is the task's own evaluation (its
# episodes, seeds and protocol), reported on the iterations that evaluate: ASHA decides a rung
# at the first evaluation at or after it, and a trial's value in the summary is its best
# evaluation, whose checkpoint is the trial's checkpoints/best.
SWEEP_METRICS = (S.TRAIN_MEAN_REWARD, S.TRAIN_MEAN_EPISODE_LENGTH, S.EVAL_MEAN_REWARD)
# ASHA's largest rung, in iterations. Tune's default (100) would stop every trial at iteration
# 100 whatever its budget; the sweep's budget (steps, time) is what ends a surviving trial.
ASHA_MAX_T = 10**9
TOP_KEYS = (
    "name",
    "algo",
    "task",
    "sim",
    "overrides",
    "search",
    "scheduler",
    "num_samples",
    "max_concurrent_trials",
    "budget",
    "log_root",
)


class SweepSpec:
    """A validated sweep YAML (one-line UserError on anything wrong)."""

    def __init__(self, path: Path, data: Dict[str, Any], extra_overrides: List[str] = ()):
        self.path = path
        unknown = [k for k in data if k not in TOP_KEYS]
        if unknown:
            raise UserError(f"{path}: " + choices_hint(unknown[0], TOP_KEYS, "sweep key"))
        self.name = str(data.get("name") or path.stem)
        self.algo = str(data.get("algo", "appo"))
        self.task = str(data.get("task", "microduck_balance"))
        self.sim = str(data.get("sim", "mujoco"))
        budget = data.get("budget") or {}
        self.overrides = [str(o) for o in (data.get("overrides") or [])] + list(extra_overrides)
        for key in ("total_steps", "time_budget_s"):
            if key in budget:
                self.overrides.append(f"training.{key}={budget[key]}")
        self.base = compose(self.algo, self.task, self.sim, self.overrides)  # validates
        if self.base.training.trace_enabled:
            raise UserError(
                "training.trace_enabled=true: traces are written per run (raylab train); a "
                "sweep's trials would share one trace folder. Trace the best trial's config "
                "with raylab train instead"
            )
        keys = [k for k, _ in iter_keys(self.base)]
        self.search: Dict[str, Dict[str, Any]] = data.get("search") or {}
        if not isinstance(self.search, dict) or not self.search:
            raise UserError(f"{path}: 'search' must map config keys to distributions")
        for key, dist in self.search.items():
            if key not in keys:
                raise UserError(f"{path}: search " + choices_hint(key, keys, "config key"))
            if not (
                isinstance(dist, dict) and len(dist) == 1 and next(iter(dist)) in DISTRIBUTIONS
            ):
                raise UserError(
                    f"{path}: search.{key} must be one of {{{', '.join(DISTRIBUTIONS)}: ...}}, "
                    f"got {dist!r}"
                )
            self._check_values(key, dist)
        sched = data.get("scheduler") or {}
        self.scheduler = str(sched.get("type", "asha"))
        if self.scheduler not in SCHEDULERS:
            raise UserError(f"{path}: " + choices_hint(self.scheduler, SCHEDULERS, "scheduler"))
        self.metric = str(sched.get("metric", S.TRAIN_MEAN_REWARD))
        if self.metric not in SWEEP_METRICS:
            raise UserError(
                f"{path}: scheduler " + choices_hint(self.metric, SWEEP_METRICS, "metric")
            )
        if self.metric == S.EVAL_MEAN_REWARD and not self.base.training.eval_every:
            raise UserError(
                f"{path}: scheduler metric {S.EVAL_MEAN_REWARD} needs evaluations during "
                "training, but training.eval_every=0; set training.eval_every (iterations "
                "between evaluations) in 'overrides'"
            )
        self.mode = str(sched.get("mode", "max"))
        if self.mode not in ("max", "min"):
            raise UserError(f"{path}: scheduler mode '{self.mode}': valid choices: max, min")
        self.grace_period = int(sched.get("grace_period", 5))
        self.reduction_factor = float(sched.get("reduction_factor", 3))
        self.num_samples = int(data.get("num_samples", 4))
        self.max_concurrent = int(data.get("max_concurrent_trials", 1))
        self.log_root = data.get("log_root")

    def _check_values(self, key: str, dist: Dict[str, Any]) -> None:
        kind, values = next(iter(dist.items()))
        if kind in ("choice", "grid"):
            if not isinstance(values, list) or not values:
                raise UserError(f"{self.path}: search.{key}.{kind} needs a non-empty list")
            candidates = values
        else:
            if not (isinstance(values, list) and len(values) == 2):
                raise UserError(f"{self.path}: search.{key}.{kind} needs [low, high]")
            low, high = (float(v) for v in values)
            if not low < high or (kind == "loguniform" and low <= 0):
                raise UserError(f"{self.path}: search.{key}.{kind} bounds {values} are invalid")
            candidates = [values[0]]
        for value in candidates:  # type-check each candidate against the schema
            compose(self.algo, self.task, self.sim, self.overrides + [f"{key}={json.dumps(value)}"])

    def param_space(self) -> Dict[str, Any]:
        from ray import tune

        space = {}
        for key, dist in self.search.items():
            kind, v = next(iter(dist.items()))
            if kind == "choice":
                space[key] = tune.choice(v)
            elif kind == "grid":
                space[key] = tune.grid_search(v)
            elif kind == "uniform":
                space[key] = tune.uniform(float(v[0]), float(v[1]))
            elif kind == "loguniform":
                space[key] = tune.loguniform(float(v[0]), float(v[1]))
            else:  # randint; load_spec refused any other kind
                space[key] = tune.randint(int(v[0]), int(v[1]))
        return {SAMPLED_KEY: space}

    def trial_config(self, sampled: Dict[str, Any]):
        overrides = self.overrides + [f"{k}={json.dumps(v)}" for k, v in sorted(sampled.items())]
        return compose(self.algo, self.task, self.sim, overrides)


def load_spec(file: str, extra_overrides: List[str] = ()) -> SweepSpec:
    path = Path(file)
    if not path.is_file():
        raise UserError(f"sweep file '{file}' does not exist (see tune_configs/)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"{file}: not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(data, dict):
        raise UserError(f"{file}: a sweep file is a YAML mapping")
    try:
        return SweepSpec(path, data, extra_overrides)
    except UserError as e:  # every error names the file
        if str(file) in str(e):
            raise
        raise UserError(f"{file}: {e}") from None


def make_trainable(spec: SweepSpec, num_gpus_per_learner: float, env_error_board: str = ""):
    """The algorithm class, taking the sampled raylab overrides as its Tune config."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.algorithms.env_errors import BOARD_ATTR
    from raylab.train import algorithm_class

    base_cls = algorithm_class(spec.algo)

    def to_algorithm_config(config):
        if isinstance(config, dict) and SAMPLED_KEY in config:
            cfg = spec.trial_config(config[SAMPLED_KEY])
            algo_config = build_algorithm_config(cfg, num_gpus_per_learner=num_gpus_per_learner)
            setattr(algo_config, BOARD_ATTR, env_error_board)
            return algo_config
        return config

    class SweepTrial(base_cls):
        @classmethod
        def default_resource_request(cls, config):
            return base_cls.default_resource_request(to_algorithm_config(config).to_dict())

        def __init__(self, config=None, **kwargs):
            super().__init__(config=to_algorithm_config(config), **kwargs)

    SweepTrial.__name__ = SweepTrial.__qualname__ = base_cls.__name__
    return SweepTrial


class SweepProgress:
    """Progress of a sweep on stderr: one line per trial when it starts (its sampled values),
    after each of its evaluations, and at least once a minute in between."""

    def __init__(self, every_s: float = 60.0):
        self.every_s = every_s
        self._last: Dict[str, float] = {}

    def __call__(self, trial, result: Dict[str, Any], metrics: Dict[str, float]) -> None:
        import time

        from raylab.reporting import env_steps

        now = time.monotonic()
        tid = trial.trial_id
        evaluated = S.EVAL_MEAN_REWARD in result
        if tid not in self._last:
            sampled = (getattr(trial, "config", None) or {}).get(SAMPLED_KEY) or {}
            values = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(sampled.items()))
            print(f"raylab: trial {tid} started: {values}", file=sys.stderr, flush=True)
        elif not evaluated and now - self._last[tid] < self.every_s:
            return
        self._last[tid] = now
        parts = [
            f"raylab: trial {tid}",
            f"iteration {int(result.get('training_iteration', 0))}",
            f"{env_steps(result):,} env steps",
            _fmt(S.TRAIN_MEAN_REWARD, result.get(S.TRAIN_MEAN_REWARD)),
            _fmt(S.EVAL_MEAN_REWARD, result.get(S.EVAL_MEAN_REWARD)),
        ]
        print(", ".join(p for p in parts if p), file=sys.stderr, flush=True)


def _cell(value: Any) -> str:
    """A sampled value in the table: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _fmt(tag: str, value: Any) -> Optional[str]:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{tag} {value:.1f}"
    return None


def override_arg(key: str, value: Any) -> str:
    """``key=value`` as a shell argument of ``raylab train`` (a list or dict value as JSON)."""
    import shlex

    if isinstance(value, (list, dict)):
        value = json.dumps(value, separators=(",", ":"))
    return shlex.quote(f"{key}={value}")


def make_scheduler(spec: SweepSpec):
    """The sweep's Tune scheduler: ASHA on training iterations, or FIFO (every trial runs its
    budget)."""
    from ray.tune.schedulers import FIFOScheduler

    from raylab.reporting import QuietASHAScheduler

    if spec.scheduler != "asha":
        return FIFOScheduler()
    return QuietASHAScheduler(
        time_attr="training_iteration",
        max_t=ASHA_MAX_T,
        grace_period=spec.grace_period,
        reduction_factor=spec.reduction_factor,
    )


def sweep_dir_for(spec: SweepSpec) -> Path:
    from datetime import datetime

    root = Path(spec.log_root or spec.base.training.log_root or "logs/sweeps").absolute()
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    path = root / f"{spec.name}_{stamp}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def run_sweep(file: str, overrides: List[str], resume: Optional[str] = None) -> int:
    from ray import tune

    from raylab.algorithms.build import build_algorithm_config
    from raylab.algorithms.env_errors import board_name, create_board
    from raylab.algorithms.rllib_compat import release_resolved_trial_futures
    from raylab.placement import check_resources
    from raylab.reporting import (
        BudgetStopper,
        RaylabTuneCallback,
        StopRequest,
    )
    from raylab.train import (
        TUNE_DIR,
        algorithm_class,
        check_devices,
        check_ray_version,
        init_ray,
        local_gpus,
        starts_local_ray,
    )

    if resume:
        sweep_dir = Path(resume).absolute()  # Tune's storage path must be absolute
        saved = sweep_dir / "sweep.yaml"
        if not saved.is_file():
            raise UserError(f"--resume {resume}: not a raylab sweep directory (no sweep.yaml)")
        spec = load_spec(str(saved))
    else:
        spec = load_spec(file, overrides)

    # Join the cluster and hold one trial's resource request against it before the sweep
    # directory is claimed (trials run as many at once as the cluster grants).
    check_ray_version()
    if starts_local_ray(spec.base):  # refusals that need no Ray come before it starts
        check_devices(spec.base, local_gpus(), "this machine")
    resources = init_ray(spec.base)
    gpus = check_devices(spec.base, resources.get("GPU", 0.0))
    check_resources(
        spec.base,
        algorithm_class(spec.algo),
        build_algorithm_config(spec.base, num_gpus_per_learner=gpus),
    )
    if not resume:
        sweep_dir = sweep_dir_for(spec)
        data = yaml.safe_load(Path(file).read_text())
        data["overrides"] = spec.overrides  # with the command-line extras and the budget
        data.pop("budget", None)
        (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"raylab: sweep directory: {sweep_dir}", file=sys.stderr, flush=True)
    # The env-error board lives with this driver (raylab.algorithms.env_errors).
    board_ref = board_name(Path(sweep_dir).resolve())
    board = create_board(board_ref)  # noqa: F841  (kept alive while the sweep runs)
    trainable = make_trainable(spec, gpus, board_ref)
    if spec.metric == S.EVAL_MEAN_REWARD:
        # Tune refuses a result without the metric unless told otherwise: the evaluation
        # metric is in the results of the iterations that evaluate only, and ASHA decides a
        # rung at the first of them at or after it.
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    release_resolved_trial_futures()
    StopRequest.install()

    def run_dir_for(trial):
        cfg = spec.trial_config(trial.config[SAMPLED_KEY])
        path = sweep_dir / "trials" / trial.trial_id
        path.mkdir(parents=True, exist_ok=True)
        return path, to_dict(cfg)

    if resume:
        tuner = tune.Tuner.restore(
            str(sweep_dir / TUNE_DIR),
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=spec.param_space(),
            tune_config=tune.TuneConfig(
                metric=spec.metric,
                mode=spec.mode,
                scheduler=make_scheduler(spec),
                num_samples=spec.num_samples,
                max_concurrent_trials=spec.max_concurrent,
            ),
            run_config=tune.RunConfig(
                name=TUNE_DIR,
                storage_path=str(sweep_dir),
                stop=BudgetStopper.of(spec.base.training),
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=spec.base.training.checkpoint_every,
                    checkpoint_at_end=True,
                    num_to_keep=2,
                ),
                failure_config=tune.FailureConfig(max_failures=spec.base.training.max_failures),
                callbacks=[RaylabTuneCallback(run_dir_for=run_dir_for, progress=SweepProgress())],
                verbose=0,
            ),
        )
    try:
        results = tuner.fit()
    except KeyboardInterrupt:  # a second Ctrl-C: close the summaries of the running trials
        from raylab.train import mark_aborted

        for trial_dir in sorted((Path(sweep_dir) / "trials").glob("*")):
            mark_aborted(trial_dir)
        raise
    table = write_summary(spec, sweep_dir, results)
    print_table(table, spec)
    best = table["best"]
    if best is not None:
        overrides = " ".join(override_arg(k, v) for k, v in best["config"].items())
        print(
            f"raylab: best trial {best['trial_id']}: {table['metric']} {best['metric']:.4g} "
            f"with {overrides or 'the base config'}; checkpoint {best['checkpoint']}",
            file=sys.stderr,
        )
    print(f"raylab: sweep summary in {sweep_dir / 'sweep_summary.json'}", file=sys.stderr)
    return 0 if all(r.error is None for r in results) else 1


def write_summary(spec: SweepSpec, sweep_dir: Path, results) -> Dict[str, Any]:
    from raylab.metrics.rundir import read_summary, write_json_atomic

    rows = []
    for trial_dir in sorted((sweep_dir / "trials").glob("*")):
        try:
            summary = read_summary(trial_dir / "run_summary.json")
            config = json.loads((trial_dir / "run_config.json").read_text())
        except Exception:  # a trial that never reported: listed without a value
            summary, config = {}, None
        if spec.metric == S.EVAL_MEAN_REWARD:
            value = (summary.get("best_eval") or {}).get("score")
        else:
            value = (summary.get("final_metrics") or {}).get(spec.metric)
        sampled = {}
        if config:
            tree = OmegaConf.create(config)
            for k in spec.search:  # a list value (algo.hidden) as a plain list
                v = OmegaConf.select(tree, k)
                sampled[k] = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
        rows.append(
            {
                "trial_id": trial_dir.name,
                "run_dir": str(trial_dir),
                "status": summary.get("status", "unknown"),
                "stopped_by": _stopped_by(spec, summary),
                "env_steps": summary.get("env_steps"),
                "training_iteration": summary.get("training_iteration"),
                "metric": value,
                "config": sampled,
                "checkpoint": (summary.get("best_eval") or {}).get("checkpoint")
                or summary.get("last_checkpoint"),
            }
        )
    scored = [
        r for r in rows if isinstance(r["metric"], (int, float)) and math.isfinite(r["metric"])
    ]
    best = (
        (max if spec.mode == "max" else min)(scored, key=lambda r: r["metric"]) if scored else None
    )
    table = {
        "name": spec.name,
        "algo": spec.algo,
        "task": spec.task,
        "metric": spec.metric,
        "mode": spec.mode,
        "best": best,
        "trials": rows,
    }
    write_json_atomic(sweep_dir / "sweep_summary.json", table)
    with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        keys = list(spec.search)
        writer.writerow(["trial_id", "status", "env_steps", spec.metric, *keys])
        for r in rows:
            writer.writerow(
                [
                    r["trial_id"],
                    r["status"],
                    r["env_steps"],
                    r["metric"],
                    *[r["config"].get(k) for k in keys],
                ]
            )
    return table


def _stopped_by(spec: SweepSpec, summary: Dict[str, Any]) -> Optional[str]:
    """Why a finished trial ended: ``budget`` (steps, time, stop_reward or stop_eval_reward
    reached),
    ``scheduler`` (ASHA stopped it early) or ``interrupted``; None while unfinished."""
    status = summary.get("status")
    if status == "interrupted":
        return "interrupted"
    if status != "completed":
        return None
    t = spec.base.training
    reward = (summary.get("final_metrics") or {}).get(S.TRAIN_MEAN_REWARD)
    best = (summary.get("best_eval") or {}).get("score")
    if (
        (summary.get("env_steps") or 0) >= t.total_steps
        or (t.time_budget_s is not None and (summary.get("time_total_s") or 0) >= t.time_budget_s)
        or (t.stop_reward is not None and reward is not None and reward >= t.stop_reward)
        or (t.stop_eval_reward is not None and (best or -math.inf) >= t.stop_eval_reward)
    ):
        return "budget"
    return "scheduler"


def print_table(table: Dict[str, Any], spec: SweepSpec) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"sweep {table['name']}: {table['metric']} ({table['mode']})")
    t.add_column("trial", no_wrap=True)
    t.add_column("best", justify="center")
    t.add_column("status")
    t.add_column("env steps", justify="right")
    t.add_column(table["metric"], justify="right")
    for key in spec.search:
        t.add_column(key, justify="right")
    best_id = (table["best"] or {}).get("trial_id")
    for r in table["trials"]:
        metric = f"{r['metric']:.3f}" if isinstance(r["metric"], float) else "-"
        t.add_row(
            r["trial_id"],
            "*" if r["trial_id"] == best_id else "",
            r["status"],
            f"{r['env_steps'] or 0:,}",
            metric,
            *[_cell(r["config"].get(k)) for k in spec.search],
        )
    console = Console()
    if not console.is_terminal:
        # A file, a pipe or a Ray job's log has no width: the table at its natural width, not
        # cut to rich's 80-column default.
        console = Console(width=Console(width=100_000).measure(t).maximum)
    console.print(t)
