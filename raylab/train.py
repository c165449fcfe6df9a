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
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from raylab.algorithms.rllib_compat import ray_version_problem, release_resolved_trial_futures
from raylab.config import compose, to_dict
from raylab.errors import UserError
from raylab.quiet import quiet_logs

TUNE_DIR = "tune"


def _say(msg: str) -> None:
    print(f"raylab: {msg}", file=sys.stderr, flush=True)


# Set by Ray's job supervisor for the entrypoint of a submitted job (`ray job submit`), next
# to RAY_ADDRESS (the cluster's GCS address). Its value is the job's runtime_env and metadata.
JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
_DRIVER_ENV_VARS = {"PYTHONWARNINGS": "ignore::DeprecationWarning"}


def _job_env_vars() -> Optional[dict]:
    """The env_vars of the submitted job's runtime_env; None outside a Ray job."""
    raw = os.environ.get(JOB_CONFIG_ENV_VAR)
    if raw is None:
        return None
    try:
        job_env = (json.loads(raw).get("runtime_env") or {}).get("env_vars") or {}
    except (ValueError, AttributeError):
        job_env = {}
    return dict(job_env)


def _join_error(address: str, err: BaseException) -> UserError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    first = first.split(". ")[0].rstrip(".")  # Ray's messages go on with generic advice
    token_hint = (
        "set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (or a file named by "
        "RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token)"
    )
    if "authentication" in first.lower() or "token" in first.lower():
        hint = f"the cluster uses token authentication: {token_hint}"
    else:
        hint = (
            "is it running (`ray start --head`) and is resources.ray_address / RAY_ADDRESS "
            f"right? With token authentication (Ray's default) {token_hint}"
        )
    return UserError(f"cannot join the Ray cluster at {address}: {first}; {hint}")


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast (one line) when a host:port cluster address does not answer.

    Ray itself retries an unreachable GCS for minutes. ``auto`` and ``ray://`` addresses are
    left to Ray.
    """
    import socket

    if address == "auto" or "://" in address or address.count(":") != 1:
        return
    host, _, port = address.partition(":")
    if not port.isdigit():
        raise UserError(f"bad Ray address '{address}': expected host:port, auto or ray://host:port")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise _join_error(address, ConnectionError(e.strerror or str(e))) from None


def cpus_reserved(cfg: DictConfig) -> float:
    """The CPUs the run's actors reserve: its EnvRunners, plus its Learners and the main
    process (or, with num_learners=0, the main process that learns)."""
    r = cfg.resources
    need = r.num_env_runners * r.num_cpus_per_env_runner
    if r.num_learners > 0:
        return need + r.num_cpus_for_main_process + r.num_learners * r.num_cpus_per_learner
    return need + max(r.num_cpus_for_main_process, r.num_cpus_per_learner)


def init_ray(cfg: DictConfig) -> dict:
    """Join the cluster named by resources.ray_address / RAY_ADDRESS, or start Ray here.

    - ``resources.ray_address`` (an address, ``auto`` or ``ray://...``) wins over ``RAY_ADDRESS``.
    - Inside a submitted Ray job the job supervisor sets ``RAY_ADDRESS`` to the cluster, so
      ``raylab train`` joins it. A job never starts a Ray of its own: with no address there
      it stops with one line.
    - With no address at all, a private local Ray starts in this process (``address="local"``:
      never attached by accident to some other ``ray start`` cluster on this machine).
    """
    import ray

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # only raylab writes logs
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # raylab's handler stops gracefully
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Tune snapshots the experiment state (which checkpoint `--resume` restores) at most every
    # 10 s by default; a driver killed in between resumes from an older checkpoint than the
    # newest one on disk. Every 5 s keeps that window short at a negligible cost.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    if ray.is_initialized():
        return ray.cluster_resources()
    address = cfg.resources.ray_address or os.environ.get("RAY_ADDRESS") or None
    job_env = _job_env_vars()
    # A job's runtime_env is merged with the driver's by Ray, which refuses a key set twice:
    # the job's own env_vars win.
    env_vars = {k: v for k, v in _DRIVER_ENV_VARS.items() if k not in (job_env or {})}
    runtime_env = {"env_vars": env_vars} if env_vars else {}
    quiet_logs()
    if job_env is None:  # a job may bring its own setup hook; Ray refuses two
        runtime_env["worker_process_setup_hook"] = "raylab.quiet.quiet_worker"
    runtime_env = runtime_env or None
    if address:
        _say(f"joining Ray cluster at {address}" + (" (Ray job)" if job_env is not None else ""))
        _check_reachable(address)
        try:
            ray.init(
                address=address,
                runtime_env=runtime_env,
                log_to_driver=True,
                logging_level="ERROR",
            )
        except (
            ConnectionError,
            TimeoutError,
            RuntimeError,
            ray.exceptions.AuthenticationError,
        ) as e:  # RuntimeError: "Failed to connect"
            raise _join_error(address, e) from None
        if job_env is not None and not (cfg.training.log_dir or cfg.training.log_root):
            _say(
                "inside a Ray job without training.log_root: the run directory is on the "
                f"node that runs the job driver, under {os.getcwd()}; pass "
                "training.log_root=/shared/path to keep it"
            )
    elif job_env is not None:
        raise UserError(
            "running inside a Ray job but RAY_ADDRESS is empty and resources.ray_address is "
            "null: refusing to start a second Ray; set resources.ray_address=auto"
        )
    else:
        # Logical CPUs: at least what the actors reserve, so a small laptop can still run the
        # default layout (the OS shares the cores; nothing waits for a free "CPU" forever).
        num_cpus = max(os.cpu_count() or 1, int(cpus_reserved(cfg) + 0.999))
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=bool(cfg.resources.dashboard),
            runtime_env=runtime_env,
            log_to_driver=True,
            logging_level="ERROR",
        )
    return ray.cluster_resources()


def algorithm_class(name: str):
    from raylab.algorithms.algorithm import RaylabAPPO, RaylabPPO
    from raylab.algorithms.sac import RaylabSAC

    return {"ppo": RaylabPPO, "appo": RaylabAPPO, "sac": RaylabSAC}[name]


def starts_local_ray(cfg: DictConfig) -> bool:
    """Whether init_ray would start a private Ray in this process (no cluster to join)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg.resources.ray_address or os.environ.get("RAY_ADDRESS") or None
    return not address and _job_env_vars() is None


def local_gpus() -> float:
    """The GPUs a Ray started on this machine would find: the CUDA devices this process sees
    (CUDA_VISIBLE_DEVICES applies to both)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0.0
    return float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0


def check_devices(cfg: DictConfig, cluster_gpus: float, where: str = "the cluster") -> float:
    """GPUs per Learner for a cluster with ``cluster_gpus`` GPUs; a GPU option that cannot
    work there is refused with one line."""
    from raylab.algorithms.build import resolve_num_gpus_per_learner

    gpus = resolve_num_gpus_per_learner(cfg, cluster_gpus, where)
    if cfg.training.trace_cuda_events and not gpus:
        raise UserError(
            "training.trace_cuda_events=true needs GPU learners; this run's learners are on "
            f"CPU ({where} has {cluster_gpus:g} GPU), where there are no CUDA events to time: "
            "drop it (trace_enabled alone traces every phase)"
        )
    return gpus


def check_ray_version(version: Optional[str] = None) -> None:
    """Refuse a Ray release raylab is not written against (before Ray starts)."""
    problem = ray_version_problem(version)
    if problem is not None:
        raise UserError(problem)


def prepare(cfg: DictConfig):
    """Join (or start) Ray, build the AlgorithmConfig and hold its resource request against the
    cluster (raylab.placement): a run that cannot start fails here, before a run directory is
    claimed. What can be refused from the config and this machine alone (a GPU option without
    a GPU for a Ray started here) is refused before Ray starts. Returns (trainable,
    algo_config, num_gpus_per_learner)."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.placement import check_resources

    check_ray_version()
    if starts_local_ray(cfg):
        check_devices(cfg, local_gpus(), "this machine")
    resources = init_ray(cfg)
    gpus = check_devices(cfg, resources.get("GPU", 0.0))
    algo_config = build_algorithm_config(cfg, num_gpus_per_learner=gpus)
    trainable = algorithm_class(cfg.algo.name)
    check_resources(cfg, trainable, algo_config)
    return trainable, algo_config, gpus


def run_training(cfg: DictConfig, run_dir: Path, resume: bool = False, prepared=None):
    """Run (or resume) the one-trial experiment for cfg in run_dir. Returns the ResultGrid."""
    from ray import tune

    from raylab.algorithms.env_errors import BOARD_ATTR, board_name, create_board
    from raylab.metrics import trace
    from raylab.reporting import BudgetStopper, RaylabTuneCallback, StopRequest
    from raylab.terminal import make_reporter

    trainable, algo_config, gpus = prepared or prepare(cfg)
    # The env-error board lives with this driver (raylab.algorithms.env_errors); its name is
    # the run directory's, so a resumed experiment's saved config names the same one.
    setattr(algo_config, BOARD_ATTR, board_name(run_dir.resolve()))
    setattr(algo_config, trace.CONFIG_ATTR, trace_settings(cfg, run_dir))
    board = create_board(getattr(algo_config, BOARD_ATTR))  # noqa: F841  (kept alive)
    config_dict = to_dict(cfg)
    release_resolved_trial_futures()
    StopRequest.install()
    # The terminal panel / progress lines; a resumed experiment keeps the reporter Tune saved
    # with its callback (it prints plain progress lines).
    reporter = None if resume else make_reporter(config_dict, num_gpus_per_learner=gpus)

    if resume:
        from ray.tune import ResumeConfig

        # A run stopped by Ctrl-C or SIGTERM ended its trial as finished, which Tune does not
        # resume by default: continue it from its final checkpoint to the budget.
        stopped = _summary_status(run_dir) == "interrupted"
        resume_type = ResumeConfig.ResumeType.RESUME
        tuner = tune.Tuner.restore(
            str(run_dir / TUNE_DIR),
            trainable=trainable,
            _resume_config=ResumeConfig(
                finished=resume_type if stopped else ResumeConfig.ResumeType.SKIP,
                unfinished=resume_type,
                errored=resume_type,
            ),
        )
    else:
        callback = RaylabTuneCallback(
            run_dir_for=lambda trial: (run_dir, config_dict),
            progress=reporter,
        )
        tuner = tune.Tuner(
            trainable,
            param_space=algo_config,
            run_config=tune.RunConfig(
                name=TUNE_DIR,
                storage_path=str(run_dir.resolve()),
                stop=BudgetStopper.of(cfg.training),
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=cfg.training.checkpoint_every,
                    checkpoint_at_end=True,
                    num_to_keep=3,
                ),
                failure_config=tune.FailureConfig(max_failures=cfg.training.max_failures),
                callbacks=[callback],
                verbose=0,
            ),
        )
    try:
        return tuner.fit()
    finally:
        if reporter is not None:
            reporter.close()  # stop the live panel (also on Ctrl-C), print the summary


def trace_settings(cfg: DictConfig, run_dir: Path) -> Optional[dict]:
    """What every traced process needs (raylab.metrics.trace); None with tracing off."""
    t = cfg.training
    if not t.trace_enabled:
        return None
    out = Path(t.trace_output_dir).expanduser() if t.trace_output_dir else run_dir / "traces"
    return {
        "dir": str(out.absolute()),
        "thread_time": bool(t.trace_thread_time),
        "cuda_events": bool(t.trace_cuda_events),
    }


def train(
    algo: str,
    task: str,
    sim: str,
    overrides,
    resume: Optional[str] = None,
    trust_checkpoint: bool = False,
) -> int:
    from raylab.metrics.rundir import RunDirectory, check_trusted_checkpoint, resolve_run_dir

    if resume:
        run_dir = Path(resume).absolute()  # Tune's storage path must be absolute
        cfg = load_run_config(run_dir)
        if not (run_dir / TUNE_DIR).is_dir():
            raise UserError(f"--resume {resume}: no Tune experiment in {run_dir / TUNE_DIR}")
        check_trusted_checkpoint(run_dir / TUNE_DIR, run_dir, trust_checkpoint)
    else:
        cfg = compose(algo, task, sim, overrides)
    prepared = prepare(cfg)  # join the cluster, check its resources: before claiming a run dir
    if not resume:
        run_dir = resolve_run_dir(cfg)
        RunDirectory(run_dir).write_config(to_dict(cfg))
    _say(f"run directory: {run_dir}")
    from raylab.algorithms.build import physics_threads
    from raylab.envs.tasks import TASKS

    threads = ""
    if cfg.task in TASKS:
        n = physics_threads(cfg)
        auto = " (env.num_threads=auto)" if str(cfg.env.num_threads) == "auto" else ""
        threads = f" on {n} physics thread(s){auto}"
    _say(
        f"{cfg.algo.name} on {cfg.task} ({cfg.sim}): {cfg.resources.num_env_runners} EnvRunner(s)"
        f" x {cfg.env.num_envs} envs{threads}, {max(1, cfg.resources.num_learners)} Learner(s); "
        "budget "
        f"{cfg.training.total_steps:,} env steps / "
        f"{cfg.training.time_budget_s if cfg.training.time_budget_s is not None else 'no'} s"
    )
    try:
        results = run_training(cfg, run_dir, resume=bool(resume), prepared=prepared)
    except KeyboardInterrupt:  # a second Ctrl-C: no final checkpoint, but a closed summary
        mark_aborted(run_dir)
        raise
    from raylab.reporting import StopRequest

    StopRequest.finished = True  # a second Ctrl-C from here on exits at once (130)
    errors = [r.error for r in results if r.error is not None]
    status = _final_status(run_dir, failed=bool(errors))
    _say(f"run {status}; logs, summary and checkpoints in {run_dir}")
    if errors:
        _say(f"training failed: {error_line(errors[0])}")
        return 1
    return 0


def mark_aborted(run_dir: Path) -> None:
    """Close a run's summary after an abort (a second Ctrl-C): status ``interrupted``,
    ``stop_reason`` ``user_abort``; its last checkpoint, if any, stays the one to resume."""
    from raylab.metrics.rundir import RunDirectory

    rd = RunDirectory(run_dir)
    try:
        if rd.summary_path.is_file() and rd.read_summary().get("status") == "running":
            rd.update_summary(status="interrupted", stop_reason="user_abort")
    except Exception as e:  # never hide the abort behind a summary problem
        _say(f"could not close {rd.summary_path}: {e}")


def error_line(err: BaseException) -> str:
    """The last line of a trial's error (the exception itself), its class without the module
    path: ``EnvError: the env failed ...``."""
    import re

    last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(\w+: )", r"\1", last)


def _summary_status(run_dir: Path) -> Optional[str]:
    try:
        return json.loads((run_dir / "run_summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _final_status(run_dir: Path, failed: bool = False) -> str:
    try:
        return json.loads((run_dir / "run_summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError):  # no summary: the trial failed before its first result
        return "failed" if failed else "unknown"


RETIRED_KEYS = {"sac": ("algo.lr", "algo.init_log_std", "algo.init_policy_scale")}


def load_run_config(run_dir: Path) -> DictConfig:
    """The composed config of an existing run (fails with one line when it is not a run)."""
    path = run_dir / "run_config.json"
    if not path.is_file():
        raise UserError(f"'{run_dir}' is not a raylab run directory (no run_config.json)")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"'{path}' is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise UserError(f"'{path}': not a raylab run config (a JSON object is expected)")
    for field, value in (
        ("task", data.get("task")),
        ("sim", data.get("sim")),
        (
            "algo.name",
            (data.get("algo") or {}).get("name") if isinstance(data.get("algo"), dict) else None,
        ),
    ):
        if not isinstance(value, str):
            raise UserError(f"'{path}': field '{field}' is missing or not a string")
    overrides = [f"{k}={json.dumps(v)}" for k, v in _flatten(data) if k not in ("task", "sim")]
    overrides = [o for o in overrides if not o.startswith("algo.name=")]
    # Runs of earlier releases wrote keys SAC never read (it has actor / critic / alpha lrs).
    retired = RETIRED_KEYS.get(data["algo"]["name"], ())
    overrides = [o for o in overrides if o.partition("=")[0] not in retired]
    try:
        return compose(data["algo"]["name"], data["task"], data["sim"], overrides)
    except UserError as e:  # the bad field, named with the file it came from
        raise UserError(f"'{path}': {e}") from None


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key != "env.kwargs":
            yield from _flatten(v, key + ".")
        else:
            yield key, v
