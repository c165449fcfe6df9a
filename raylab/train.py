"""`raylab train`: one composed config -> a one-trial Ray Tune experiment.

The same path serves `raylab tune` (many trials). Ray is started in-process unless
``resources.ray_address`` or ``RAY_ADDRESS`` names a running cluster. The run directory holds
run_config.json, run_summary.json, the backend's event files and Tune's experiment folder
(``tune/``) with the checkpoints; ``--resume RUN_DIR`` restores the experiment from there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from raylab.config import compose, to_dict
from raylab.errors import UserError

TUNE_DIR = "tune"


def _say(msg: str) -> None:
    print(f"raylab: {msg}", file=sys.stderr, flush=True)


def init_ray(cfg: DictConfig) -> dict:
    """Join the cluster named by resources.ray_address / RAY_ADDRESS, or start Ray here."""
    import ray

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # only raylab writes logs
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # raylab's handler stops gracefully
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if ray.is_initialized():
        return ray.cluster_resources()
    address = cfg.resources.ray_address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if address:
        _say(f"joining Ray cluster at {address}")
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
    else:
        r = cfg.resources
        need = 1 + r.num_env_runners * r.num_cpus_per_env_runner
        need += max(1, r.num_learners) * r.num_cpus_per_learner
        # Logical CPUs: at least what the actors reserve, so a small laptop can still run the
        # default layout (the OS shares the cores; nothing waits for a free "CPU" forever).
        num_cpus = max(os.cpu_count() or 1, int(need + 0.999))
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=bool(cfg.resources.dashboard),
            runtime_env=runtime_env,
            log_to_driver=True,
            logging_level="ERROR",
        )
    return ray.cluster_resources()


def algorithm_class(name: str):
    from ray.rllib.algorithms.appo import APPO
    from ray.rllib.algorithms.ppo import PPO
    from ray.rllib.algorithms.sac import SAC

    return {"ppo": PPO, "appo": APPO, "sac": SAC}[name]


def _progress_printer(every_s: float = 5.0):
    state = {"last": 0.0}

    def progress(trial, result, metrics):
        from raylab.metrics import schema as S

        now = time.time()
        if now - state["last"] < every_s:
            return
        state["last"] = now
        rew = metrics.get(S.TRAIN_MEAN_REWARD)
        fps = metrics.get(S.PERF_TOTAL_FPS)
        print(
            f"iter {int(result.get('training_iteration', 0)):>5}  "
            f"steps {int(result['env_runners'].get('num_env_steps_sampled_lifetime', 0)):>10,}  "
            f"steps/s {fps or 0:>8,.0f}  "
            f"reward {('%.2f' % rew) if rew is not None else '-':>9}  "
            f"time {result.get('time_total_s', 0):>6.0f}s",
            flush=True,
        )

    return progress


def run_training(cfg: DictConfig, run_dir: Path, resume: bool = False):
    """Run (or resume) the one-trial experiment for cfg in run_dir. Returns the ResultGrid."""
    from ray import tune

    from raylab.algorithms.build import build_algorithm_config, resolve_num_gpus_per_learner
    from raylab.reporting import BudgetStopper, RaylabTuneCallback, StopRequest

    resources = init_ray(cfg)
    gpus = resolve_num_gpus_per_learner(cfg, resources.get("GPU", 0.0))
    algo_config = build_algorithm_config(cfg, num_gpus_per_learner=gpus)
    config_dict = to_dict(cfg)
    trainable = algorithm_class(cfg.algo.name)
    StopRequest.install()

    if resume:
        tuner = tune.Tuner.restore(
            str(run_dir / TUNE_DIR), trainable=trainable, resume_unfinished=True,
            resume_errored=True,
        )
    else:
        callback = RaylabTuneCallback(
            run_dir_for=lambda trial: (run_dir, config_dict),
            progress=_progress_printer(),
        )
        tuner = tune.Tuner(
            trainable,
            param_space=algo_config,
            run_config=tune.RunConfig(
                name=TUNE_DIR,
                storage_path=str(run_dir.resolve()),
                stop=BudgetStopper(cfg.training.total_steps, cfg.training.time_budget_s),
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=cfg.training.checkpoint_every,
                    checkpoint_at_end=True,
                    num_to_keep=3,
                ),
                callbacks=[callback],
                verbose=0,
            ),
        )
    return tuner.fit()


def train(algo: str, task: str, sim: str, overrides, resume: Optional[str] = None) -> int:
    from raylab.metrics.rundir import RunDirectory, resolve_run_dir

    if resume:
        run_dir = Path(resume)
        cfg = load_run_config(run_dir)
        if not (run_dir / TUNE_DIR).is_dir():
            raise UserError(f"--resume {resume}: no Tune experiment in {run_dir / TUNE_DIR}")
    else:
        cfg = compose(algo, task, sim, overrides)
        run_dir = resolve_run_dir(cfg)
        RunDirectory(run_dir).write_config(to_dict(cfg))
    _say(f"run directory: {run_dir}")
    _say(
        f"{cfg.algo.name} on {cfg.task} ({cfg.sim}): {cfg.resources.num_env_runners} EnvRunner(s)"
        f" x {cfg.env.num_envs} envs, {max(1, cfg.resources.num_learners)} Learner(s); budget "
        f"{cfg.training.total_steps:,} env steps / "
        f"{cfg.training.time_budget_s if cfg.training.time_budget_s is not None else 'no'} s"
    )
    results = run_training(cfg, run_dir, resume=bool(resume))
    status = _final_status(run_dir)
    errors = [r.error for r in results if r.error is not None]
    _say(f"run {status}; logs, summary and checkpoints in {run_dir}")
    if errors:
        _say(f"training failed: {str(errors[0]).splitlines()[-1]}")
        return 1
    return 0


def _final_status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "run_summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError):
        return "unknown"


def load_run_config(run_dir: Path) -> DictConfig:
    """The composed config of an existing run (fails with one line when it is not a run)."""
    path = run_dir / "run_config.json"
    if not path.is_file():
        raise UserError(f"'{run_dir}' is not a raylab run directory (no run_config.json)")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"'{path}' is not valid JSON: {e}") from e
    overrides = [f"{k}={json.dumps(v)}" for k, v in _flatten(data) if k not in ("task", "sim")]
    overrides = [o for o in overrides if not o.startswith("algo.name=")]
    return compose(data["algo"]["name"], data["task"], data["sim"], overrides)


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key != "env.kwargs":
            yield from _flatten(v, key + ".")
        else:
            yield key, v
