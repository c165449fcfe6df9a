"""What every raylab benchmark shares: timed windows, drift / trend guards, the machine check,
and the result file (JSON with its schema check).

The protocol (``benchmarks/README.md``):

- A measurement is a *window*: a step function called back to back for a fixed wall time;
  the rate is env steps (or updates) per wall second. The same window also reads this
  process's CPU time (and, where given, the CPU time of child processes), so the cost of the
  work can be told apart from a machine that is busy with something else.
- A *reference* is a window of one fixed configuration (one thread), measured before a sweep
  and after every row. The reference should not change; when it does, the machine changed.
  The guards judge the machine from the reference series alone:

  - ``unstable``: some reference differs from the first one by more than ``drift_limit``
    (10%);
  - ``trending``: three consecutive references move one way (each step up, or each step down)
    and the third differs from the first by more than ``trend_limit`` (4%);
  - ``stable``: neither. With fewer than two references nothing can be judged: ``unchecked``.

- Before a run the machine check reads the load average, the cores this process may use and
  the other processes that are busy; its warnings go into the result. The load average is
  read again after the run, so a number taken on a busy machine says so in its own file.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from raylab.envs.core.backend import usable_cores  # noqa: F401  (also this module's public name)
from raylab.errors import UserError

RESULT_SCHEMA = "raylab.bench/1"
KINDS = ("env_sweep", "env_sustained", "compare", "train", "sampler")

DRIFT_LIMIT = 0.10
TREND_LIMIT = 0.04
TREND_SPAN = 3  # windows

QUIET_LOAD = 0.5  # 1-min load average at or above which the machine is called busy
BUSY_CPU = 0.10  # another process using this share of one core or more counts as busy


# ------------------------------------------------------------------------------ guards


def drifts(refs: Sequence[float]) -> List[float]:
    """Relative change of every reference window against the first one (first is 0.0)."""
    if not refs:
        return []
    base = float(refs[0])
    if base <= 0:
        raise ValueError(f"the first reference rate must be positive, got {base}")
    return [float(r) / base - 1.0 for r in refs]


def find_trends(
    refs: Sequence[float], limit: float = TREND_LIMIT, span: int = TREND_SPAN
) -> List[Dict[str, Any]]:
    """Every run of ``span`` consecutive references that moves one way by more than ``limit``.

    One way: each step strictly up, or each step strictly down. The size of the move is the
    last window of the run against its first. Returns ``[{"start", "end", "change"}]``.
    """
    out = []
    for i in range(len(refs) - span + 1):
        run = [float(x) for x in refs[i : i + span]]
        steps = [b - a for a, b in zip(run, run[1:])]
        one_way = all(s > 0 for s in steps) or all(s < 0 for s in steps)
        change = run[-1] / run[0] - 1.0 if run[0] > 0 else float("inf")
        if one_way and abs(change) > limit:
            out.append({"start": i, "end": i + span - 1, "change": change})
    return out


def guard(
    refs: Sequence[float], drift_limit: float = DRIFT_LIMIT, trend_limit: float = TREND_LIMIT
) -> Dict[str, Any]:
    """The verdict on a reference series: ``unstable`` > ``trending`` > ``stable``.

    Both flags are kept (``unstable``, ``trending``); the verdict names the worse one.
    """
    refs = [float(r) for r in refs]
    if len(refs) < 2:
        return {
            "verdict": "unchecked",
            "unstable": False,
            "trending": False,
            "refs": refs,
            "drifts": drifts(refs),
            "max_abs_drift": 0.0,
            "trends": [],
            "drift_limit": drift_limit,
            "trend_limit": trend_limit,
        }
    d = drifts(refs)
    max_abs = max(abs(x) for x in d)
    trends = find_trends(refs, trend_limit)
    unstable = max_abs > drift_limit
    trending = bool(trends)
    verdict = "unstable" if unstable else "trending" if trending else "stable"
    return {
        "verdict": verdict,
        "unstable": unstable,
        "trending": trending,
        "refs": refs,
        "drifts": d,
        "max_abs_drift": max_abs,
        "trends": trends,
        "drift_limit": drift_limit,
        "trend_limit": trend_limit,
    }


# ----------------------------------------------------------------------------- windows


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) from /proc; 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_window(
    step: Callable[[], Any],
    seconds: float,
    items_per_call: int,
    child_pids: Iterable[int] = (),
) -> Dict[str, float]:
    """Call ``step`` back to back for ``seconds`` of wall time.

    Returns ``calls``, ``wall_s``, ``cpu_s`` (this process, every thread, plus ``child_pids``),
    ``rate`` (items per wall second) and ``cpu_rate`` (items per CPU second).
    """
    pids = list(child_pids)
    c0 = time.process_time() + sum(proc_cpu_seconds(p) for p in pids)
    t0 = time.perf_counter()
    calls = 0
    while True:
        step()
        calls += 1
        wall = time.perf_counter() - t0
        if wall >= seconds:
            break
    cpu = time.process_time() + sum(proc_cpu_seconds(p) for p in pids) - c0
    items = calls * items_per_call
    return {
        "calls": calls,
        "wall_s": wall,
        "cpu_s": cpu,
        "rate": items / wall,
        "cpu_rate": items / cpu if cpu > 0 else float("nan"),
    }


# ------------------------------------------------------------------------------ machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> Dict[str, Any]:
    """The machine and the software a number was taken on (no host names, no users)."""
    import numpy as np

    info: Dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cpu_model": _cpu_model(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    for name in ("mujoco", "gymnasium"):  # light, and every benchmark uses them
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            pass
    for name in ("torch", "ray"):  # heavy: recorded when the benchmark imported them
        mod = sys.modules.get(name)
        if mod is not None:
            info[name] = getattr(mod, "__version__", "?")
    return info


def _own_pids() -> set:
    """This process and its descendants (they are the benchmark, not competition)."""
    own = {os.getpid()}
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in own and pid not in own:
                own.add(pid)
                grew = True
    return own


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        if cmd:
            return cmd[:80]
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def busy_processes(interval: float = 0.5, threshold: float = BUSY_CPU) -> List[Dict[str, Any]]:
    """Other processes using at least ``threshold`` of one core over ``interval`` seconds."""
    if not os.path.isdir("/proc"):
        return []
    own = _own_pids()

    def sample() -> Dict[int, float]:
        out = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in own:
                out[int(entry)] = proc_cpu_seconds(int(entry))
        return out

    a = sample()
    t0 = time.perf_counter()
    time.sleep(interval)
    b = sample()
    dt = time.perf_counter() - t0
    busy = []
    for pid, cpu in b.items():
        share = (cpu - a.get(pid, cpu)) / dt
        if share >= threshold:
            busy.append({"pid": pid, "cpu": round(share, 2), "name": _proc_name(pid)})
    return sorted(busy, key=lambda p: -p["cpu"])[:10]


def machine_check(threads_needed: int = 1, interval: float = 0.5) -> Dict[str, Any]:
    """Load average, usable cores and busy processes before a run; warnings as sentences."""
    load = [round(x, 2) for x in os.getloadavg()]
    cores = usable_cores()
    busy = busy_processes(interval)
    warnings = []
    if load[0] >= QUIET_LOAD:
        warnings.append(
            f"load average (1 min) {load[0]:.2f} >= {QUIET_LOAD}: other work is running; "
            "rates will be low and noisy"
        )
    if busy:
        names = ", ".join(f"'{p['name'][:48]}' ({p['cpu']:.0%})" for p in busy[:4])
        warnings.append(f"{len(busy)} other process(es) busy: {names}")
    if threads_needed > cores:
        warnings.append(
            f"{threads_needed} threads/workers on {cores} usable core(s): the machine is "
            "overcommitted by the benchmark itself"
        )
    if cores < (os.cpu_count() or cores):
        warnings.append(f"this process may use {cores} of {os.cpu_count()} cores (affinity)")
    return {"loadavg": load, "usable_cores": cores, "busy": busy, "warnings": warnings}


# ------------------------------------------------------------------------------- result


def round_order(names: Sequence, rounds: int) -> List[Tuple[int, Any]]:
    """(round, name) in the order a benchmark runs them: every name once per round, the order
    reversed every other round (A B, B A, A B, ...), so that neither side always runs first
    or last while the machine drifts."""
    names = list(names)
    return [(r, n) for r in range(rounds) for n in (names if r % 2 == 0 else names[::-1])]


def command_line(prog: str, argv: Sequence[str]) -> str:
    """The shell command that reproduces a run."""
    return " ".join([prog, *(shlex.quote(a) for a in argv)])


def new_result(kind: str, command: str, params: Mapping[str, Any], check: Mapping[str, Any]):
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; valid: {', '.join(KINDS)}")
    return {
        "schema": RESULT_SCHEMA,
        "kind": kind,
        "command": command,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "params": dict(params),
        "machine": machine_info(),
        "machine_check": dict(check),
        "_t0": time.perf_counter(),
    }


def finish_result(result: Dict[str, Any], verdict: str, guard_info: Optional[dict]) -> dict:
    result["verdict"] = verdict
    result["guard"] = guard_info
    result["duration_s"] = round(time.perf_counter() - result.pop("_t0"), 2)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


# Keys every result has, and per kind the keys of its body (and of each of its rows).
_COMMON = {
    "schema": str,
    "kind": str,
    "command": str,
    "created": str,
    "params": dict,
    "machine": dict,
    "machine_check": dict,
    "verdict": str,
    "duration_s": (int, float),
    "loadavg_after": list,
}
_BODY = {
    "env_sweep": (
        "rows",
        ("threads", "env_steps_per_s", "per_thread", "speedup", "efficiency", "drift_after"),
    ),
    "env_sustained": ("windows", ("window", "env_steps_per_s")),
    "compare": ("rows", ("workers", "backend", "env_steps_per_s")),
    "train": ("runs", ("contender", "env_steps_per_s", "updates_per_s")),
    "sampler": ("rows", ("contender", "round", "env_steps_per_s")),
}
VERDICTS = ("stable", "trending", "unstable", "unchecked")


class ResultSchemaError(ValueError):
    pass


def validate_result(result: Mapping[str, Any]) -> None:
    """Raise :class:`ResultSchemaError` (one line) unless ``result`` is a benchmark result."""
    if not isinstance(result, Mapping):
        raise ResultSchemaError("a benchmark result is a JSON object")
    for key, typ in _COMMON.items():
        if key not in result:
            raise ResultSchemaError(f"result has no '{key}'")
        if not isinstance(result[key], typ):
            raise ResultSchemaError(f"result '{key}' has the wrong type")
    if result["schema"] != RESULT_SCHEMA:
        raise ResultSchemaError(f"result schema {result['schema']!r} is not {RESULT_SCHEMA!r}")
    if result["kind"] not in KINDS:
        raise ResultSchemaError(f"result kind {result['kind']!r}; valid: {', '.join(KINDS)}")
    if result["verdict"] not in VERDICTS:
        raise ResultSchemaError(
            f"result verdict {result['verdict']!r}; valid: {', '.join(VERDICTS)}"
        )
    for key in ("cpu_count", "loadavg"):
        if key not in result["machine"]:
            raise ResultSchemaError(f"result machine has no '{key}'")
    for key in ("loadavg", "warnings"):
        if key not in result["machine_check"]:
            raise ResultSchemaError(f"result machine_check has no '{key}'")
    body, row_keys = _BODY[result["kind"]]
    rows = result.get(body)
    if not isinstance(rows, list) or not rows:
        raise ResultSchemaError(f"{result['kind']} result has no '{body}' list")
    for i, row in enumerate(rows):
        for key in row_keys:
            if key not in row:
                raise ResultSchemaError(f"{result['kind']} result {body}[{i}] has no '{key}'")


def _clean(obj):
    """JSON-safe copy: NaN / inf become null, numpy scalars become Python numbers."""
    import math

    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else None
    return obj


def save_result(result: Dict[str, Any], path: str | os.PathLike) -> Path:
    """Validate and write a result as indented JSON; returns the path."""
    clean = _clean(result)
    validate_result(clean)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(clean, indent=1) + "\n")
    return out


def load_result(path: str | os.PathLike) -> Dict[str, Any]:
    """Read and validate a result file (ResultSchemaError / OSError on failure)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ResultSchemaError(f"{p} is not valid JSON ({e.msg}, line {e.lineno})") from None
    validate_result(data)
    return data


def print_check(check: Mapping[str, Any], out=sys.stdout) -> None:
    load = check["loadavg"]
    print(
        f"machine: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{check['usable_cores']} usable core(s)",
        file=out,
    )
    for w in check["warnings"]:
        print(f"  warning: {w}", file=out)


def fmt_pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.1%}"


# --------------------------------------------------------------------------------- CLI


class BenchParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (a :class:`UserError`), as in ``raylab``."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message}")


class BenchFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parse_options(items: Sequence[str]) -> Dict[str, Any]:
    """``KEY=VALUE`` env options; VALUE is read as JSON when it parses (0.9, true, [1, 2])."""
    out: Dict[str, Any] = {}
    for text in items:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise UserError(f"--option {text!r}: expected KEY=VALUE (for example push_vel_max=0.9)")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a plain string such as v1
    return out


def positive(kind: type, name: str):
    """An argparse type: a number > 0 (one clear line otherwise)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a {kind.__name__}, got {text!r}"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {text}")
        return value

    parse.__name__ = name
    return parse
