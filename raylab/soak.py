"""``raylab soak``: a training run watched for hours, and its ``soak.json`` (artifact 0.3.0).

A run that is fine for 3 minutes can still leak memory, slow down or stall after 2 hours. The
soak runs ``raylab train`` in this process and a monitor thread beside it that samples, every
few seconds:

- progress ticks: env steps and iterations from ``run_summary.json`` (the driver rewrites it with
  every result);
- each actor of the run (Ray's state API, ``list_actors``): state, restarts, and its resident
  memory (read from the process on this node; null for actors on other nodes);
- object store use (the state API's object summary).

Every ``--window`` seconds the samples become one window: throughput, iterations, memory per
actor, object store, restarts. The monitor stops the run (after the current iteration, like
Ctrl-C) when progress stalls for ``--stale-s`` seconds (``timeout/stale_tick``) or an actor's
memory, or the object store's use, grows faster than ``--leak-mb-per-min`` across the windows
after warm-up (``resource_leak``).

``soak.json`` (:data:`SOAK_SCHEMA_VERSION`) accepts metric schema 1 and runtime manifest 1 only.
``failure_classification`` is null on a pass; else the producer's class when the run failed on
its own (the runtime manifest's ``shutdown.classification``: ``learner_failure``,
``collector_failure``, ``backend_worker_failure``, ``external_cancellation``,
``unknown_failure``), which identifies the initiating owner, otherwise the monitor's
(``timeout/stale_tick``, ``resource_leak``). ``shutdown`` is the manifest's raw shutdown
mapping (null when teardown produced none); producer snapshots are appended to
``producer_snapshots`` and never replace ``failure_reason``. :func:`validate_soak` reads it
fail-closed.
"""

from __future__ import annotations

import _thread
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from raylab.errors import UserError

SOAK_SCHEMA_VERSION = "0.3.0"
ACCEPTED_METRIC_SCHEMA_VERSIONS = (1,)
ACCEPTED_MANIFEST_SCHEMA_VERSIONS = (1,)
PRODUCER_CLASSES = (
    "learner_failure",
    "collector_failure",
    "backend_worker_failure",
    "timeout/stale_tick",
    "external_cancellation",
    "unknown_failure",
)
MONITOR_CLASSES = ("timeout/stale_tick", "resource_leak")
FAILURE_CLASSES = tuple(dict.fromkeys(PRODUCER_CLASSES + MONITOR_CLASSES))
SOAK_FILE = "soak.json"
ESCALATE_S = 90.0  # a stop the run does not honour within this is forced (KeyboardInterrupt)


def parse_duration(text: str, what: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` -> seconds (one-line error otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"{what}={text}: give a positive duration such as 90s, 30m or 2h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def slope(xs: List[float], ys: List[float]) -> Optional[float]:
    """Least-squares slope of ys over xs (None with fewer than 2 distinct xs)."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def rss_mb(pid: int) -> Optional[float]:
    """Resident memory of a process on this machine in MiB (None if it cannot be read): from
    /proc on Linux, else through the psutil that Ray ships (on the path once Ray is imported)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
        import ray  # noqa: F401

        return psutil.Process(pid).memory_info().rss / 2**20
    except Exception:
        return None


# -------------------------------------------------------------------------------- monitor


# The object store's use, beside the actors in the memory slopes and the leak check.
OBJECT_STORE = "object store"


class Monitor(threading.Thread):
    """Watches a run directory and the Ray cluster of this process; stops a failing run."""

    def __init__(
        self,
        run_dir: Path,
        window_s: float,
        stale_s: float,
        leak_mb_per_min: float,
        sample_s: Optional[float] = None,
        warmup_s: float = 30.0,
        leak_span_s: float = 60.0,
    ):
        super().__init__(name="raylab-soak-monitor", daemon=True)
        self.run_dir = Path(run_dir)
        self.window_s = float(window_s)
        self.stale_s = float(stale_s)
        self.leak_mb_per_min = float(leak_mb_per_min)
        self.warmup_s = float(warmup_s)  # of training before memory counts towards a leak
        self.leak_span_s = float(leak_span_s)  # the shortest stretch a leak is judged on
        self.sample_s = float(sample_s or min(5.0, max(1.0, window_s / 4)))
        self.windows: List[Dict[str, Any]] = []
        self.classification: Optional[str] = None
        self.reason: Optional[str] = None
        self.errors: List[str] = []  # what the monitor itself could not read (kept, reported)
        self._done = threading.Event()
        self._samples: List[Dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._last_tick: Optional[float] = None
        self._last_steps = -1
        self._rss: Dict[str, List[tuple]] = {}  # actor -> [(t, rss_mb)] per window, warm
        self._seen: Dict[str, int] = {}  # actor -> windows it was alive in
        self._prev_last: Optional[Dict[str, Any]] = None  # the previous window's last sample
        self._first_tick: Optional[float] = None
        self._stop_requested_at: Optional[float] = None
        self._address: Optional[str] = None

    # ---- thread ------------------------------------------------------------------------------
    def run(self) -> None:
        window_start = time.monotonic()
        while not self._done.wait(self.sample_s):
            try:
                self._sample()
            except Exception as e:  # never let the monitor die silently
                self._note_error(f"sample: {type(e).__name__}: {e}")
            if time.monotonic() - window_start >= self.window_s:
                self._close_window(window_start)
                window_start = time.monotonic()
            self._check()
        if self._samples:
            self._close_window(window_start)

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=30)

    def _note_error(self, text: str) -> None:
        if text not in self.errors and len(self.errors) < 20:
            self.errors.append(text)

    # ---- sampling ----------------------------------------------------------------------------
    def _sample(self) -> None:
        now = time.monotonic()
        summary = self._summary()
        steps = int(summary.get("env_steps") or 0)
        if steps > self._last_steps:
            if self._last_steps >= 0 or steps > 0:
                self._last_tick = now
                if self._first_tick is None and steps > 0:
                    self._first_tick = now
            self._last_steps = steps
        sample = {
            "t": now - self._t0,
            "env_steps": steps,
            "iteration": int(summary.get("training_iteration") or 0),
            "actors": self._actors(),
            "object_store_mb": self._object_store_mb(),
        }
        self._samples.append(sample)

    def _summary(self) -> Dict[str, Any]:
        path = self.run_dir / "run_summary.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}  # not written yet, or being replaced

    def _ray_address(self) -> Optional[str]:
        if self._address is None:
            import ray

            if not ray.is_initialized():
                return None
            self._address = ray.get_runtime_context().gcs_address
        return self._address

    def _actors(self) -> Dict[str, Dict[str, Any]]:
        address = self._ray_address()
        if address is None:
            return {}
        import ray
        from ray.util.state import list_actors

        context = ray.get_runtime_context()
        here, job = context.get_node_id(), context.get_job_id()
        out: Dict[str, Dict[str, Any]] = {}
        # This run's actors only: on a shared cluster other jobs' actors (and those of earlier
        # runs, kept by the state API after they died) are not this soak's.
        filters = [("job_id", "=", job)]
        for a in list_actors(
            address=address, filters=filters, detail=True, raise_on_missing_output=False
        ):
            name = f"{a.class_name}-{a.actor_id[:8]}"
            rss = None
            if a.state == "ALIVE" and a.pid and a.node_id == here:
                rss = rss_mb(a.pid)
            out[name] = {
                "class": a.class_name,
                "state": a.state,
                "pid": a.pid,
                "restarts": int(a.num_restarts or 0),
                "rss_mb": rss,
            }
        return out

    def _object_store_mb(self) -> Optional[float]:
        address = self._ray_address()
        if address is None:
            return None
        from ray.util.state import summarize_objects

        summary = summarize_objects(address=address, raise_on_missing_output=False)
        return float(summary.get("cluster", {}).get("total_size_mb", 0.0))

    # ---- windows -----------------------------------------------------------------------------
    def _close_window(self, window_start: float) -> None:
        samples, self._samples = self._samples, []
        if not samples:
            return
        # Throughput from the previous window's last sample, so no step falls between windows.
        first, last = self._prev_last or samples[0], samples[-1]
        self._prev_last = last
        span = max(last["t"] - first["t"], 1e-9)
        index = len(self.windows)
        actors: Dict[str, Dict[str, Any]] = {}
        for s in samples:
            for name, a in s["actors"].items():
                entry = actors.setdefault(name, {"class": a["class"], "rss_mb_max": None})
                entry.update(state=a["state"], pid=a["pid"], restarts=a["restarts"])
                if a["rss_mb"] is not None:
                    entry["rss_mb_max"] = max(entry["rss_mb_max"] or 0.0, a["rss_mb"])
                    entry["rss_mb_last"] = a["rss_mb"]
        warm = self._first_tick is not None and time.monotonic() - self._first_tick >= self.warmup_s
        for name, entry in actors.items():
            # Each actor's resident memory at the end of each window, once training has run for
            # warmup_s (allocator pools, metrics and the first batches grow at first) and the
            # actor has lived through one full window (a restarted actor warms up too).
            if entry.get("rss_mb_last") is not None:
                seen = self._seen[name] = self._seen.get(name, 0) + 1
                if warm and seen > 1:
                    self._rss.setdefault(name, []).append((last["t"], entry["rss_mb_last"]))
        stores = [s["object_store_mb"] for s in samples if s["object_store_mb"] is not None]
        if warm and stores:  # judged like an actor's memory: a steady rise is a leak too
            self._rss.setdefault(OBJECT_STORE, []).append((last["t"], stores[-1]))
        rss_total = sum(a.get("rss_mb_last") or 0.0 for a in actors.values())
        self.windows.append(
            {
                "index": index,
                "start_s": round(first["t"], 3),
                "end_s": round(last["t"], 3),
                "samples": len(samples),
                "env_steps": last["env_steps"],
                "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span
                if last is not first
                else 0.0,
                "iterations": last["iteration"] - first["iteration"],
                "actors": actors,
                "rss_total_mb": rss_total,
                "object_store_mb": max(stores) if stores else None,
                "restarts": sum(a["restarts"] for a in actors.values()),
                "progress_tick_age_s": (
                    round(time.monotonic() - self._last_tick, 3)
                    if self._last_tick is not None
                    else None
                ),
            }
        )

    # ---- verdicts ------------------------------------------------------------------------------
    def memory_slopes(self) -> Dict[str, float]:
        """MB per minute of each actor's resident memory, and of the object store's use
        (:data:`OBJECT_STORE`), over the windows after warm-up (at least four of them, spanning
        leak_span_s)."""
        out = {}
        for name, points in self._rss.items():
            if len(points) < 4 or points[-1][0] - points[0][0] < self.leak_span_s:
                continue
            s = slope([t / 60.0 for t, _ in points], [m for _, m in points])
            if s is not None:
                out[name] = s
        return out

    def _check(self) -> None:
        now = time.monotonic()
        if self.classification is None:
            started = self._last_tick if self._last_tick is not None else None
            grace = self.stale_s + 120.0  # Ray start-up and the first iteration
            if started is not None and now - started > self.stale_s:
                self._fail(
                    "timeout/stale_tick",
                    f"no progress for {now - started:.0f} s (env steps stuck at "
                    f"{self._last_steps:,}; --stale-s {self.stale_s:g})",
                )
            elif started is None and now - self._t0 > grace:
                self._fail("timeout/stale_tick", f"no first progress tick in {grace:.0f} s")
            else:
                leaks = {n: s for n, s in self.memory_slopes().items() if s > self.leak_mb_per_min}
                if leaks:
                    name, rate = max(leaks.items(), key=lambda kv: kv[1])
                    self._fail(
                        "resource_leak",
                        f"{name} memory grows {rate:.1f} MB/min "
                        f"(--leak-mb-per-min {self.leak_mb_per_min:g})",
                    )
        if (
            self._stop_requested_at is not None
            and now - self._stop_requested_at > ESCALATE_S
            and not self._done.is_set()
        ):
            print(
                f"raylab: soak: the run did not stop within {ESCALATE_S:.0f} s; aborting it",
                file=sys.stderr,
                flush=True,
            )
            self._stop_requested_at = None
            _thread.interrupt_main()  # a KeyboardInterrupt in train(): summary closed

    def _fail(self, classification: str, reason: str) -> None:
        from raylab.reporting import StopRequest

        self.classification, self.reason = classification, reason
        self._stop_requested_at = time.monotonic()
        StopRequest.request("soak", f"soak monitor: {classification}: {reason}")


# ------------------------------------------------------------------------------- artifact


def producer_classification(summary: Dict[str, Any]) -> Optional[str]:
    """The failure class the run itself reports (None for a completed run)."""
    from raylab.reporting import failure_class

    status = summary.get("status")
    if status == "completed":
        return None
    if status == "interrupted":
        reason = summary.get("stop_reason")
        if reason == "monitor_stop":
            return None  # the monitor stopped it: its own class stands
        return "external_cancellation"
    manifest = summary.get("runtime_manifest") or {}
    shutdown = manifest.get("shutdown") or {}
    if shutdown.get("classification") in PRODUCER_CLASSES:
        return shutdown["classification"]
    return failure_class(str(summary.get("error") or ""))


def build_artifact(
    run_dir: Path,
    monitor: Monitor,
    command: str,
    settings: Dict[str, Any],
    started_at: float,
    exit_code: Optional[int],
) -> Dict[str, Any]:
    from raylab.metrics.rundir import SUMMARY_FILE

    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        summary = {}
    manifest = summary.get("runtime_manifest") or None
    producer = producer_classification(summary) if summary else "unknown_failure"
    if not summary:
        monitor._note_error(f"{run_dir / SUMMARY_FILE} was never written")
    classification = producer or monitor.classification
    reason = None
    if classification is not None:
        if producer is not None:
            shutdown_error = ((manifest or {}).get("shutdown") or {}).get("error")
            reason = str(
                shutdown_error or summary.get("error") or summary.get("stop_reason") or producer
            )
        else:
            reason = monitor.reason
    shutdown = (manifest or {}).get("shutdown")
    # Windows with progress after the first (start-up): the throughput band and its trend.
    rates = [w["env_steps_per_s"] for w in monitor.windows[1:] if w["env_steps_per_s"] > 0]
    trend = slope(list(range(len(rates))), rates) if len(rates) >= 2 else None
    window_h = monitor.window_s / 3600.0
    return {
        "schema_version": SOAK_SCHEMA_VERSION,
        "metric_schema_version": summary.get("metric_schema_version", 1),
        "runtime_manifest_schema_version": (manifest or {}).get("schema_version", 1),
        "command": command,
        "run_dir": str(run_dir),
        "settings": settings,
        "started_at": started_at,
        "ended_at": time.time(),
        "exit_code": exit_code,
        "run_status": summary.get("status"),
        "passed": classification is None,
        "windows": monitor.windows,
        "throughput": {
            "band_env_steps_per_s": [min(rates), max(rates)] if rates else None,
            "mean_env_steps_per_s": sum(rates) / len(rates) if rates else None,
            # change per hour, as a share of the mean (windows after the first)
            "trend_per_hour": (trend / window_h / (sum(rates) / len(rates)))
            if trend is not None and rates and sum(rates) > 0
            else None,
        },
        "memory_slope_mb_per_min": monitor.memory_slopes(),
        "monitor_errors": list(monitor.errors),
        "failure_classification": classification,
        "failure_reason": reason,
        "monitor_classification": monitor.classification,
        "producer_classification": producer,
        "shutdown": shutdown,
        "producer_snapshots": [shutdown] if isinstance(shutdown, dict) else [],
    }


def _fail(where: str, message: str):
    return UserError(f"{where}: {message}")


def validate_soak(d: Any, where: str = SOAK_FILE) -> None:
    """Raise UserError unless ``d`` is a soak artifact this version reads (fail-closed)."""
    if not isinstance(d, dict):
        raise _fail(where, "not a JSON object")
    version = d.get("schema_version")
    if version != SOAK_SCHEMA_VERSION:
        raise _fail(where, f"schema_version {version!r}; this reader accepts {SOAK_SCHEMA_VERSION}")
    for key, accepted in (
        ("metric_schema_version", ACCEPTED_METRIC_SCHEMA_VERSIONS),
        ("runtime_manifest_schema_version", ACCEPTED_MANIFEST_SCHEMA_VERSIONS),
    ):
        if d.get(key) not in accepted or isinstance(d.get(key), bool):
            raise _fail(where, f"{key} {d.get(key)!r}; accepted: {', '.join(map(str, accepted))}")
    for key in ("windows", "failure_classification", "shutdown", "producer_snapshots", "passed"):
        if key not in d:
            raise _fail(where, f"missing '{key}'")
    if not isinstance(d["windows"], list):
        raise _fail(where, "windows must be a list")
    for i, w in enumerate(d["windows"]):
        if not isinstance(w, dict):
            raise _fail(where, f"windows[{i}] must be an object")
        for key in ("index", "start_s", "end_s", "env_steps", "env_steps_per_s", "restarts"):
            v = w.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise _fail(where, f"windows[{i}].{key} must be a finite number, got {v!r}")
    cls = d["failure_classification"]
    if cls is not None and cls not in FAILURE_CLASSES:
        raise _fail(
            where, f"failure_classification {cls!r}; valid: null, {', '.join(FAILURE_CLASSES)}"
        )
    if not isinstance(d["producer_snapshots"], list):
        raise _fail(where, "producer_snapshots must be a list")
    shutdown = d["shutdown"]
    if shutdown is not None and not isinstance(shutdown, dict):
        raise _fail(where, "shutdown must be an object or null")
    if d["passed"] is not (cls is None):
        raise _fail(where, "passed must be true exactly when failure_classification is null")
    if cls is None:
        if not isinstance(shutdown, dict) or shutdown.get("classification") != "normal_completion":
            raise _fail(where, "a pass needs shutdown.classification normal_completion")
        for key in ("owner", "phase"):
            if not isinstance(shutdown.get(key), str) or not shutdown[key]:
                raise _fail(where, f"a pass needs a non-empty shutdown.{key}")
        if shutdown.get("cleanup_errors"):
            raise _fail(where, "a pass cannot have shutdown.cleanup_errors")
    elif not d.get("failure_reason"):
        raise _fail(where, "a failure needs its failure_reason")


def read_soak(path) -> Dict[str, Any]:
    """A soak.json, validated."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read a soak artifact ({e})") from None
    validate_soak(d, where=str(path))
    return d


# ------------------------------------------------------------------------------------ CLI


def run_soak(
    algo: str,
    task: str,
    sim: str,
    overrides: List[str],
    duration: str,
    window: str,
    stale: Optional[str],
    leak_mb_per_min: float,
    warmup: str = "30s",
    leak_span: str = "60s",
) -> int:
    from raylab.config import compose
    from raylab.metrics.rundir import resolve_run_dir
    from raylab.train import train

    duration_s = parse_duration(duration, "--duration")
    window_s = parse_duration(window, "--window")
    stale_s = parse_duration(stale, "--stale") if stale else max(120.0, 3 * window_s)
    warmup_s = parse_duration(warmup, "--warmup")
    leak_span_s = parse_duration(leak_span, "--leak-span")
    if window_s > duration_s:
        raise UserError(f"--window {window} is longer than --duration {duration}")
    if leak_mb_per_min <= 0:
        raise UserError(f"--leak-mb-per-min {leak_mb_per_min:g}: must be positive")
    overrides = list(overrides) + [f"training.time_budget_s={duration_s:g}"]
    cfg = compose(algo, task, sim, overrides)
    if not cfg.resources.dashboard:
        raise UserError(
            "resources.dashboard=false: raylab soak reads actors and the object store through "
            "Ray's state API, which the dashboard serves; leave it on"
        )
    if cfg.training.log_dir is None:  # the monitor needs the run directory up front
        run_dir = resolve_run_dir(cfg, create=False)
        overrides.append(f"training.log_dir={run_dir}")
    else:
        run_dir = Path(str(cfg.training.log_dir)).expanduser().absolute()
    settings = {
        "algo": algo,
        "task": task,
        "duration_s": duration_s,
        "window_s": window_s,
        "stale_s": stale_s,
        "leak_mb_per_min": leak_mb_per_min,
        "warmup_s": warmup_s,
        "leak_span_s": leak_span_s,
        "overrides": overrides,
        "cpus": os.cpu_count(),
    }
    command = " ".join(["raylab", *sys.argv[1:]]) if sys.argv else "raylab soak"
    print(
        f"raylab: soak: {duration_s:g} s of training, windows of {window_s:g} s, stale after "
        f"{stale_s:g} s, leak above {leak_mb_per_min:g} MB/min",
        file=sys.stderr,
        flush=True,
    )
    monitor = Monitor(
        run_dir, window_s, stale_s, leak_mb_per_min, warmup_s=warmup_s, leak_span_s=leak_span_s
    )
    started_at = time.time()
    monitor.start()
    code: Optional[int] = None
    try:
        code = train(algo, task, sim, overrides)
    except KeyboardInterrupt:
        code = 130
    finally:
        monitor.finish()
        if run_dir.is_dir():
            artifact = build_artifact(run_dir, monitor, command, settings, started_at, code)
            out = run_dir / SOAK_FILE
            out.write_text(json.dumps(artifact, indent=1))
            verdict = (
                "passed"
                if artifact["passed"]
                else f"failed: {artifact['failure_classification']}: {artifact['failure_reason']}"
            )
            print(f"raylab: soak {verdict}; {out}", file=sys.stderr, flush=True)
            if not artifact["passed"] and code == 0:
                code = 1
    return code if code is not None else 1
