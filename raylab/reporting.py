"""Driver side: RLlib results -> canonical metrics -> run directory, backend, terminal.

``canonical_metrics`` is the one mapping from an RLlib result dict onto the canonical schema
(unit conversion: RLlib timers are seconds, ``_ms`` tags are milliseconds; throughputs are
totals across EnvRunners; learner values are averaged across Learners, weighted by their sample
counts through the tracker's partial states). ``RaylabTuneCallback`` runs in the driver
process and is the only writer of TensorBoard / W&B, ``run_config.json``, ``run_summary.json``
and the runtime manifest. The x-axis of every chart is env steps sampled.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from ray import tune
from ray.rllib.utils.metrics import EVALUATION_RESULTS
from ray.tune.schedulers import ASHAScheduler

from raylab.algorithms.algorithm import (
    BEST_EVAL_KEY,
    EPISODE_LOG_KEY,
    EVAL_BEFORE_TRAIN_KEY,
    EVALUATED_MODULE_DIR,
    LEARNER_MODULE_DIR,
    eval_tags,
)
from raylab.algorithms.callbacks import FLOW_KEY, RUNTIME_KEY
from raylab.metrics import schema as S
from raylab.metrics.timeline import (
    COLLECTOR_TRACKER,
    LEARNER_TRACKER,
    RAYLAB_KEY,
    pull_final_stats,
)

STEPS_KEY = ("env_runners", "num_env_steps_sampled_lifetime")

# RLlib per-module learner stats -> canonical tag.
_LEARNER_STATS = {
    "policy_loss": S.loss_tag("policy"),
    "vf_loss": S.loss_tag("value"),
    "mean_kl_loss": S.loss_tag("kl"),
    "qf_loss": S.loss_tag("critic"),
    "actor_loss": S.loss_tag("actor"),
    "alpha_loss": S.loss_tag("alpha"),
    "entropy": S.policy_tag("entropy"),
    "curr_entropy_coeff": S.policy_tag("entropy_coeff"),
    "curr_kl_coeff": S.policy_tag("kl_coeff"),
    "vf_explained_var": S.policy_tag("vf_explained_var"),
    "gradients_default_optimizer_global_norm": S.policy_tag("grad_norm"),
    "default_optimizer_learning_rate": S.policy_tag("learning_rate"),
    "alpha_value": S.policy_tag("alpha"),
    "qf_mean": S.policy_tag("q_mean"),
    "mean_IS": S.policy_tag("importance_ratio"),
}


def _get(d: dict, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(float(x))


def env_steps(result: dict) -> int:
    return int(_get(result, *STEPS_KEY, default=0) or 0)


def canonical_metrics(result: dict, previous: Optional[dict] = None) -> Dict[str, float]:
    """Map one RLlib training result onto canonical tags (not yet validated)."""
    out: Dict[str, float] = {}
    er = result.get("env_runners", {})

    def put(tag: str, value, scale: float = 1.0):
        if _finite(value):
            out[tag] = float(value) * scale

    # raylab's reward window (written by the algorithm, raylab.algorithms.algorithm).
    put(S.TRAIN_MEAN_REWARD, result.get(S.TRAIN_MEAN_REWARD))
    put(S.TRAIN_MEAN_EPISODE_LENGTH, result.get(S.TRAIN_MEAN_EPISODE_LENGTH))
    # An evaluation that ran this iteration (Eval/* from the eval stats tracker).
    for tag, value in eval_tags(result.get(EVALUATION_RESULTS)).items():
        put(tag, value)

    # Throughput of the whole job: env steps sampled by all EnvRunners per wall second.
    steps, t = env_steps(result), float(result.get("time_total_s", 0.0))
    if previous is not None:
        d_steps, d_t = steps - env_steps(previous), t - float(previous.get("time_total_s", 0.0))
    else:  # this driver's first result (a new run, or the first after --resume): one iteration
        runners = result.get(STEPS_KEY[0])
        this_iter = runners.get("num_env_steps_sampled") if isinstance(runners, dict) else None
        # Without the iteration's own count the lifetime count is this iteration's only in a
        # new run; after a restore it holds the restored steps, so no rate is reported then.
        iteration = result.get("training_iteration", 1)
        restored = iteration != result.get("iterations_since_restore", iteration)
        d_steps = float(this_iter) if _finite(this_iter) else (None if restored else steps)
        d_t = float(result.get("time_this_iter_s", 0.0)) if d_steps is not None else 0.0
    if d_t > 0:
        put(S.PERF_TOTAL_FPS, d_steps / d_t)

    # Collector timeline (RLlib's EnvRunner timers are seconds).
    put(S.PERF_COLLECTION_TIME, er.get("sample"))
    put(S.PERF_COLLECTOR_ENV_STEP_MS, er.get("env_step_timer"), 1000.0)
    put(S.PERF_COLLECTOR_MLP_INFER_MS, er.get("rlmodule_inference_timer"), 1000.0)
    # Algorithm loop: weight broadcast to the EnvRunners.
    put(S.PERF_WEIGHT_BROADCAST_MS, _get(result, "timers", "synch_weights"), 1000.0)
    put(S.PERF_ENV_RUNNER_RESTARTS, _get(result, "fault_tolerance", "num_remote_worker_restarts"))

    # Partial states from the learner and collector trackers, merged across actors by RLlib.
    for where, name in (("learners", LEARNER_TRACKER), ("env_runners", COLLECTOR_TRACKER)):
        for tag, value in pull_final_stats(result, where, name).items():
            if not tag.startswith("_"):
                put(tag, value)

    # RLlib's own per-module learner statistics (already averaged across Learners).
    for module_id, stats in result.get("learners", {}).items():
        if module_id.startswith("__") or module_id == RAYLAB_KEY or not isinstance(stats, dict):
            continue
        for key, tag in _LEARNER_STATS.items():
            if tag not in out:
                put(tag, stats.get(key))

    trained = _get(result, "learners", "__all_modules__", "num_env_steps_trained")
    if _finite(trained) and result.get("time_this_iter_s"):
        put(S.PERF_LEARNER_ROWS_PER_S, float(trained) / float(result["time_this_iter_s"]))
    return out


def shutdown_mapping(status: str, stop_reason: Optional[str], error: Optional[str]) -> dict:
    """The runtime manifest's ``shutdown`` (experimental): how the trial ended, who ended it
    and in which phase. ``classification`` uses the soak monitor's failure classes."""
    if status == "completed":
        classification, owner, phase = "normal_completion", "driver", "budget reached"
    elif status == "interrupted":
        classification = "external_cancellation"
        owner = {
            "user_interrupt": "user (Ctrl-C)",
            "monitor_stop": "raylab soak monitor",
            "user_abort": "user (second Ctrl-C)",
        }.get(stop_reason or "", "external (SIGTERM)")
        phase = "stopped after the current iteration"
    else:
        classification, owner, phase = failure_class(error or ""), "trial", "trial error"
    out = {
        "classification": classification,
        "owner": owner,
        "phase": phase,
        "stop_reason": stop_reason,
        "cleanup_errors": [],
    }
    if error:
        lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
        out["error"] = lines[-1] if lines else error
    return out


def failure_class(error: str) -> str:
    """A trial error's failure class, from the error Tune recorded (its text): the physics
    backend's worker error, then the EnvRunner, then the Learner side, by the classes and
    modules named in the traceback (the algorithm's ``repr=...``, which names both, is left
    out); anything else is ``unknown_failure``."""
    import re

    text = re.sub(r"repr=[^\n]*", "", error)
    if "BackendWorkerError" in text:
        return "backend_worker_failure"
    if re.search(r"EnvRunner|EnvError|env_runner", text):
        return "collector_failure"
    if re.search(r"Learner|learner_group\.py|/learner\.py|learners\.py", text):
        return "learner_failure"
    return "unknown_failure"


class StopRequest:
    """Ctrl-C / SIGTERM -> a graceful stop: trials stop, checkpoint at the end, logs flush.

    A second Ctrl-C falls through to Python's default (KeyboardInterrupt); once training has
    returned (``finished``: the summary is closed, Ray is shutting down) it exits with 130 at
    once instead, where a KeyboardInterrupt would only interrupt an exit handler.
    """

    requested = threading.Event()
    forwarded = threading.Event()  # passed on to the running algorithms (their boards)
    finished = False  # training returned: what is left is shutting down
    signal_name: Optional[str] = None  # the first stop signal: SIGINT (Ctrl-C) or SIGTERM

    @classmethod
    def stop_reason(cls) -> Optional[str]:
        """Why the run was stopped early: ``external_cancellation`` (SIGTERM: ``ray job stop``,
        a scheduler, ``kill``) or ``user_interrupt`` (Ctrl-C); None when it was not."""
        if not cls.requested.is_set():
            return None
        if cls.signal_name and cls.signal_name.startswith("monitor"):
            return "monitor_stop"
        return "external_cancellation" if cls.signal_name == "SIGTERM" else "user_interrupt"

    @classmethod
    def request(cls, who: str, why: str) -> None:
        """Stop the run after the current iteration from inside this process (``raylab
        soak``'s monitor); ``stop_reason`` becomes ``monitor_stop``."""
        if cls.requested.is_set():
            return
        cls.signal_name = f"monitor:{who}"
        cls.requested.set()
        print(f"raylab: stopping after this iteration: {why}", file=sys.stderr, flush=True)

    @classmethod
    def install(cls) -> None:
        cls.finished = False

        def handler(signum, frame):
            if cls.requested.is_set():
                if cls.finished:
                    from raylab.quiet import flush_std_streams

                    print("raylab: interrupted", file=sys.stderr, flush=True)
                    flush_std_streams()
                    os._exit(130)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            cls.signal_name = signal.Signals(signum).name
            cls.requested.set()
            print(
                "\nraylab: stopping after this iteration (checkpoint + logs); "
                "Ctrl-C again to abort",
                file=sys.stderr,
                flush=True,
            )

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)


class BudgetStopper(tune.Stopper):
    """Stop on env steps, wall time, a target mean reward or a target evaluation return,
    whichever first, or on request."""

    def __init__(
        self,
        total_steps: int,
        time_budget_s: Optional[float],
        stop_reward: Optional[float] = None,
        stop_eval_reward: Optional[float] = None,
    ):
        self.total_steps = int(total_steps)
        self.time_budget_s = time_budget_s
        self.stop_reward = stop_reward
        self.stop_eval_reward = stop_eval_reward

    @classmethod
    def of(cls, training) -> "BudgetStopper":
        """The stopper of a config's ``training`` section."""
        return cls(
            training.total_steps,
            training.time_budget_s,
            training.stop_reward,
            training.get("stop_eval_reward"),
        )

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        if env_steps(result) >= self.total_steps:
            return True
        reward = result.get(S.TRAIN_MEAN_REWARD)
        if self.stop_reward is not None and _finite(reward) and reward >= self.stop_reward:
            return True
        # The best evaluation so far (a trained policy's; its checkpoint is this iteration's
        # or an earlier one's, kept as checkpoints/best).
        best = (result.get(BEST_EVAL_KEY) or {}).get("score")
        if self.stop_eval_reward is not None and _finite(best) and best >= self.stop_eval_reward:
            return True
        if self.time_budget_s is not None and result.get("time_total_s", 0) >= self.time_budget_s:
            return True
        return StopRequest.requested.is_set()

    def stop_all(self) -> bool:
        # Never: Tune's experiment-wide stop ends running trials without their final
        # checkpoint and without on_trial_complete. A stop request ends each trial at its next
        # result instead (above), which checkpoints it (checkpoint_at_end) and closes its
        # summary.
        return False


class QuietASHAScheduler(ASHAScheduler):
    """Tune's ASHA without numpy's ``All-NaN slice`` warning. ``Train/mean_reward`` is NaN until
    a trial's first episode ends, and ASHA's rung cutoff (``np.nanpercentile``) leaves NaN out,
    as it should; numpy warns when a rung holds nothing else yet. The decisions are Tune's."""

    def on_trial_result(self, tune_controller, trial, result):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            return super().on_trial_result(tune_controller, trial, result)


class RaylabTuneCallback(tune.Callback):
    """Driver-side writer: one run directory per trial, canonical metrics, summary, manifest.

    ``run_dir_for(trial) -> (Path, config_dict)`` says where each trial's run directory is and
    what config it ran with. Runtime objects (backends) are created lazily and dropped when
    pickled, so Tune can save and restore the experiment.
    """

    def __init__(self, run_dir_for: Callable, progress: Optional[Callable] = None):
        self.run_dir_for = run_dir_for
        self.progress = progress
        self._runs: Dict[str, dict] = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_runs"] = {}
        return state

    # --- helpers -------------------------------------------------------------------------
    def _run(self, trial) -> dict:
        from raylab.metrics.backends import make_backend
        from raylab.metrics.rundir import RunDirectory

        run = self._runs.get(trial.trial_id)
        if run is None:
            path, config = self.run_dir_for(trial)
            rd = RunDirectory(Path(path))
            if not (rd.path / "run_config.json").exists():
                rd.write_config(config)
            # (Re)started: running again, whatever ended an earlier attempt.
            rd.update_summary(
                status="running", trial_id=trial.trial_id, end_time=None, stop_reason=None
            )
            backend = make_backend(_training_cfg(config), rd.path, config)
            run = {"dir": rd, "backend": backend, "prev": None, "last": {}, "manifest": None}
            self._runs[trial.trial_id] = run
        return run

    @staticmethod
    def _manifest(run: dict, runtime: dict) -> dict:
        from raylab.metrics.manifest import build_manifest, collect_cluster_info

        config = run["dir"].read_config()
        runners = runtime["env_runners"]
        return build_manifest(
            **collect_cluster_info(),
            env_runners=runners,
            learners=runtime["learners"],
            envs_per_runner=int(config["env"]["num_envs"]),
            # the physics threads each EnvRunner's env really runs (env.num_threads may be auto)
            threads_per_runner=int(runners[0].get("num_threads", 1)) if runners else 1,
            sim_backend=config.get("sim", "mujoco"),
            sim_backend_device=None,  # MuJoCo on the CPU: no accelerator binding
            collector_backend_device=None,
            collector_metric_interval_s=float(config["training"].get("iteration_s", 0.0)),
            counters={"env_runner_restarts": float(runtime.get("restarts", 0))},
            backend_diagnostics=runtime.get("backend_diagnostics"),
        )

    @staticmethod
    def _flow(run: dict, flow: dict, result: dict) -> None:
        """The manifest's per-result fields: in flight, ring, ingress and counters."""
        manifest = run["manifest"]
        manifest["inference_flight"] = flow.get("inference_flight")
        learners = [s for s in flow.get("learners") or [] if isinstance(s, dict)]
        counters = manifest["counters"]
        counters["env_steps_sampled"] = float(env_steps(result))
        counters["training_iterations"] = float(result.get("training_iteration", 0))
        if learners:
            counters["learner_updates"] = float(sum(s.get("updates", 0) for s in learners))
        rings = [s["ring"] for s in learners if s.get("ring")]
        if not rings:
            return
        ring = rings[0]
        capacity = sum(r["capacity"] for r in rings)
        manifest["ring"] = {"kind": ring["kind"], "unit": ring["unit"], "capacity": capacity}
        occupancy = min(1.0, sum(r["size"] for r in rings) / capacity)
        high = min(1.0, sum(r["high_water"] for r in rings) / capacity)
        times = [r["ingest_ms_mean"] for r in rings if r.get("ingest_ms_mean") is not None]
        previous = (manifest.get("replay_ingress") or {}).get("high_water_occupancy", 0.0)
        manifest["replay_ingress"] = {
            "ingested": int(sum(r["ingested"] for r in rings)),
            "occupancy": occupancy,
            # Cumulative for the run: a restarted Learner starts its own count from zero.
            "high_water_occupancy": max(previous, high, occupancy),
            "ingest_ms_mean": sum(times) / len(times) if times else None,
        }

    # --- Tune hooks ------------------------------------------------------------------------
    def on_step_begin(self, iteration, trials, **info):
        # A Ctrl-C / SIGTERM reaches the running algorithm through the run's board, so an
        # iteration that would run on to fill training.iteration_s ends at its next learner
        # update (RaylabAlgorithmMixin.cut_iteration_on_stop).
        if StopRequest.requested.is_set() and not StopRequest.forwarded.is_set():
            from raylab.algorithms.env_errors import forward_stop

            forward_stop()
            StopRequest.forwarded.set()

    def on_trial_start(self, iteration, trials, trial, **info):
        run = self._run(trial)
        # Tune restores a (re)started trial from its newest recorded checkpoint right after this
        # hook: say which one, and keep the history in the summary.
        checkpoint = trial.checkpoint
        if checkpoint is not None:
            recorded = str(checkpoint.path)
            path = recover_rotated_checkpoint(trial)
            gone = (
                f" (Tune's last snapshot named {recorded}, rotated away since)"
                if path != recorded
                else ""
            )
            print(
                f"raylab: restoring trial {trial.trial_id} from checkpoint {path}{gone}",
                file=sys.stderr,
                flush=True,
            )
            history = run["dir"].read_summary().get("restored_from", [])
            run["dir"].update_summary(restored_from=[*history, path])

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run = self._run(trial)
        metrics = S.normalize(canonical_metrics(result, run["prev"]))
        step = env_steps(result)
        before = S.normalize(eval_tags(result.get(EVAL_BEFORE_TRAIN_KEY)))
        if before and run.get("logged_step", -1) < 0:
            # The initial policy's evaluation, at env step 0 (before any sample was trained on).
            run["backend"].log(0, before)
            run["logged_step"] = 0
            run["dir"].update_summary(initial_eval=before)
        # Each tag once per step: an iteration that sampled nothing new (an asynchronous
        # learner can finish one before fresh samples arrive) is held and merged into the
        # next step's values.
        run["pending"] = {**run.get("pending", {}), **metrics}
        if step > run.get("logged_step", -1):
            run["backend"].log(step, run.pop("pending"))
            # On disk before the summary names this iteration: a killed driver loses no
            # iteration it reported (the writer's own timer flushes every 30 s).
            run["backend"].flush()
            run["logged_step"] = step
        episodes = result.get(EPISODE_LOG_KEY)
        if episodes:  # training.episode_log
            run["dir"].append_episodes(step, int(result.get("training_iteration", 0)), episodes)
        # The summary keeps each tag's latest value (not every iteration reports every tag).
        run["prev"], run["last"] = result, {**run["last"], **metrics}
        runtime = result.get(RUNTIME_KEY)
        if runtime is not None:
            previous = run["manifest"]
            run["manifest"] = self._manifest(run, runtime)
            if previous is not None:  # a rebuilt manifest (restarts) keeps the run's figures
                for key in ("inference_flight", "ring", "replay_ingress"):
                    run["manifest"][key] = previous.get(key)
                run["manifest"]["counters"] = {
                    **previous["counters"],
                    **run["manifest"]["counters"],
                }
        flow = result.get(FLOW_KEY)
        if run["manifest"] is not None and isinstance(flow, dict):
            self._flow(run, flow, result)
        if run["manifest"] is not None:
            # Run counters: restarts, and the replay size / timeout rate where they exist.
            for name, tag in (
                ("env_runner_restarts", S.PERF_ENV_RUNNER_RESTARTS),
                ("replay_buffer_size", S.PERF_REPLAY_BUFFER_SIZE),
                ("episode_timeout_rate", S.EPISODE_TIMEOUT_RATE),
            ):
                if tag in run["last"]:
                    run["manifest"]["counters"][name] = float(run["last"][tag])
        run["dir"].update_summary(
            final_metrics=run["last"],
            env_steps=step,
            training_iteration=int(result.get("training_iteration", 0)),
            time_total_s=float(result.get("time_total_s", 0.0)),
            runtime_manifest=run["manifest"],
        )
        best = result.get(BEST_EVAL_KEY)
        if isinstance(best, dict) and best != run.get("seen_best"):
            run["seen_best"] = dict(best)
            # A new best evaluation (this iteration's) unless the run directory already holds
            # a better one: after --resume the algorithm's best is its checkpoint's, which can
            # be older than what the driver recorded before it died.
            prior = run["dir"].read_summary().get("best_eval") or {}
            if prior.get("score") is None or float(best["score"]) > float(prior["score"]):
                # Recorded once its checkpoint is copied (on_checkpoint), so the summary never
                # names a best without its checkpoint.
                run["best"] = {
                    "score": float(best["score"]),
                    "training_iteration": int(best["iteration"]),
                    "env_steps": step,
                }
        if self.progress is not None:
            self.progress(trial, result, metrics)
        from raylab.dashboard import export_result  # Ray dashboard gauges (never raises)

        export_result(run["dir"].path, trial.trial_id, metrics)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        run = self._run(trial)
        run["dir"].update_summary(last_checkpoint=str(checkpoint.path))
        best = run.pop("best", None)
        last = trial.last_result or {}
        if best is not None and best["training_iteration"] == int(
            last.get("training_iteration", -1)
        ):
            # This checkpoint holds the best evaluated policy so far: keep a copy as `best`
            # (Tune rotates its own checkpoints away, num_to_keep).
            dest = keep_best_checkpoint(Path(checkpoint.path), run["dir"].checkpoint_dir)
            run["dir"].update_summary(
                best_eval={**best, "checkpoint": str(dest), "source": str(checkpoint.path)}
            )
        elif best is not None:
            run["best"] = best  # a checkpoint of another iteration: wait for the best's

    def _finish(self, trial, status: str, error: Optional[str] = None, error_text: str = ""):
        run = self._runs.get(trial.trial_id)
        if run is None:
            return
        fields = {"end_time": time.time()}
        if status == "completed" and StopRequest.requested.is_set():
            status = "interrupted"
            fields["stop_reason"] = StopRequest.stop_reason()
        fields["status"] = status
        if error:
            fields["error"] = error
        manifest = run["manifest"]
        if manifest is not None:
            manifest["shutdown"] = shutdown_mapping(
                status, fields.get("stop_reason"), error_text or error
            )
            fields["runtime_manifest"] = manifest
        run["dir"].update_summary(**fields)
        run["backend"].close()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finish(trial, "completed")

    def on_trial_error(self, iteration, trials, trial, **info):
        error_file = getattr(trial, "error_file", None)
        text = ""
        if error_file and Path(error_file).is_file():
            text = Path(error_file).read_text(errors="replace")[-4000:]
        self._finish(trial, "failed", error=str(error_file or "trial error"), error_text=text)

    def on_experiment_end(self, trials, **info):
        for trial in trials:
            run = self._runs.pop(trial.trial_id, None)
            if run is not None:
                run["backend"].close()


def _complete_checkpoints(folder: Path) -> list:
    """The checkpoint directories in a trial's folder that hold an algorithm state, newest
    written first (by that file: after an earlier resume Tune's indices restart below those a
    killed driver left and it writes into their folders, so neither the index nor the
    folder's own time orders them)."""
    found = [p / "algorithm_state.pkl" for p in folder.glob("checkpoint_*")]
    found = [f for f in found if f.is_file()]
    return [f.parent for f in sorted(found, key=lambda f: f.stat().st_mtime, reverse=True)]


def recover_rotated_checkpoint(trial) -> str:
    """The checkpoint a (re)started trial restores from, made to exist.

    Tune snapshots its experiment state every few seconds and deletes old checkpoints
    (``num_to_keep``) in between; a driver killed after a deletion but before the next
    snapshot leaves a state whose checkpoints are gone, and Tune would fail the trial on
    resume. Such a trial is pointed at the newest complete checkpoint in its folder instead
    (newer than the one named: nothing before the last checkpoint is lost; the restored
    algorithm state sets the iteration). Other named checkpoints that are gone get an empty
    folder, so Tune's rotation deletes them without an error. Tune's ``Trial.set_storage``
    repoints checkpoints the same way.
    """
    manager = trial.run_metadata.checkpoint_manager
    latest = manager.latest_checkpoint_result
    checkpoint = latest.checkpoint
    path = Path(checkpoint.path)
    if checkpoint.filesystem.type_name != "local" or path.is_dir():
        return str(path)
    newest = _complete_checkpoints(path.parent)
    if not newest:
        return str(path)  # nothing to fall back on: Tune's own error names the path
    latest.checkpoint = type(checkpoint)(path=str(newest[0]), filesystem=checkpoint.filesystem)
    for result in manager.best_checkpoint_results:
        if result is not latest:
            Path(result.checkpoint.path).mkdir(parents=True, exist_ok=True)
    trial.invalidate_json_state()
    trial.run_metadata.invalidate_cache()
    return str(newest[0])


def keep_best_checkpoint(source: Path, folder: Path) -> Path:
    """Copy a checkpoint to ``folder/best``, replacing the previous best only once the copy is
    complete (a crash meanwhile leaves the old one). The copy's policy is the one the
    evaluation ran: where the checkpoint holds the evaluated module (APPO's and SAC's Learners
    move on during an evaluation), it takes the Learner module's place."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    dest, tmp = folder / "best", folder / ".best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    evaluated = tmp / EVALUATED_MODULE_DIR
    if evaluated.is_dir() and (tmp / LEARNER_MODULE_DIR).is_dir():
        shutil.rmtree(tmp / LEARNER_MODULE_DIR)
        evaluated.rename(tmp / LEARNER_MODULE_DIR)
    old = folder / ".best.old"
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def _training_cfg(config: dict):
    from omegaconf import OmegaConf

    return OmegaConf.create(config.get("training", {}))
