"""``raylab trace RUN_DIR``: one Perfetto timeline from a run's per-process trace files, and
where the time went.

Every process of a traced run (:mod:`raylab.metrics.trace`) wrote its own file of trace events
on the same clock (wall-time microseconds, ``perf_counter`` plus the offset the process measured
when it started). The files of one machine (one boot id) share ``perf_counter``'s monotonic
clock, so the merge puts them on one offset, their median: a process whose own reading of the
offset was off (a wall-clock step, a pause between the two reads) would otherwise show its
phases milliseconds early or late against the others. The merge reads the files fail-closed
(a file that is not trace-event JSON, or an event without the fields its phase needs, is an
error naming the file; an array left open by a killed process is closed, as the format
allows), gives every file its own process id (pids of two nodes can collide), and writes
``<trace dir>/merged.json`` in the JSON object format (``traceEvents`` + ``displayTimeUnit``)
that Perfetto and chrome://tracing open.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from raylab.errors import UserError
from raylab.metrics.trace import FILE_SUFFIX, NESTED_TRACK

MERGED = "merged.json"
PHASES = {"X", "M", "i", "I", "B", "E"}


def load_events(path: Path) -> List[Dict[str, Any]]:
    """The events of one trace file (JSON array format, possibly left open), validated."""
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not trace-event JSON ({e.msg} at line {e.lineno})") from None
        events = data.get("traceEvents") if isinstance(data, dict) else None
    else:
        if not text.startswith("["):
            raise UserError(f"{path}: not trace-event JSON (neither an array nor an object)")
        body = text.rstrip()
        if not body.endswith("]"):  # a process killed before it closed its array
            lines = body.splitlines()
            if len(lines) > 1 and not lines[-1].rstrip(",").endswith("}"):
                # killed in the middle of a write: its last event is cut off (dropped)
                lines = lines[:-1]
            body = "\n".join(lines).rstrip(",\n ") + "\n]"
        try:
            events = json.loads(body)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not trace-event JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(events, list):
        raise UserError(f"{path}: no list of trace events")
    for i, ev in enumerate(events):
        problem = event_problem(ev)
        if problem:
            raise UserError(f"{path}: event {i}: {problem}")
    return events


def event_problem(ev: Any) -> Optional[str]:
    """What makes ``ev`` an invalid trace event (the fields its phase type needs), or None."""
    if not isinstance(ev, dict):
        return "not an object"
    ph = ev.get("ph")
    if ph not in PHASES:
        return f"phase type {ph!r}; valid: {', '.join(sorted(PHASES))}"
    if not isinstance(ev.get("name"), str):
        return "no name"
    if not isinstance(ev.get("pid"), int):
        return "no integer pid"
    if ph == "M":
        return None if isinstance(ev.get("args"), dict) else "metadata without args"
    if not isinstance(ev.get("ts"), (int, float)):
        return "no numeric ts"
    if not isinstance(ev.get("tid"), int):
        return "no integer tid"
    if ph == "X" and not (isinstance(ev.get("dur"), (int, float)) and ev["dur"] >= 0):
        return "complete event without a non-negative dur"
    return None


def trace_files(trace_dir: Path) -> List[Path]:
    return sorted(p for p in trace_dir.glob(f"*{FILE_SUFFIX}") if p.is_file())


def find_trace_dir(run_dir: Path) -> Path:
    """The run's trace folder: training.trace_output_dir of its config, else <run_dir>/traces."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"raylab trace: {run_dir} is not a directory")
    configured = None
    config = run_dir / "run_config.json"
    if config.is_file():
        try:
            training = json.loads(config.read_text()).get("training", {})
            configured = training.get("trace_output_dir")
        except (json.JSONDecodeError, AttributeError):
            configured = None
    for candidate in ([Path(configured).expanduser()] if configured else []) + [
        run_dir / "traces",
        run_dir,
    ]:
        if candidate.is_dir() and trace_files(candidate):
            return candidate
    raise UserError(
        f"raylab trace: no trace files (*{FILE_SUFFIX}) for {run_dir}; train with "
        "training.trace_enabled=true to write them"
    )


def clock_of(events: List[Dict[str, Any]]) -> Tuple[Optional[str], Optional[float]]:
    """(boot id, offset µs) from a file's ``raylab_clock`` metadata; (None, None) for a file
    written without them."""
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "raylab_clock":
            offset = ev["args"].get("offset_us")
            boot = ev["args"].get("boot_id")
            if isinstance(boot, str) and isinstance(offset, (int, float)):
                return boot, float(offset)
    return None, None


def clock_shifts(clocks: List[Tuple[Optional[str], Optional[float]]]) -> List[float]:
    """Per file, the µs to add to its timestamps so that every file of one machine uses that
    machine's median offset (0 for a file without clock metadata)."""
    by_boot: Dict[str, List[float]] = defaultdict(list)
    for boot, offset in clocks:
        if boot is not None:
            by_boot[boot].append(offset)
    common = {boot: sorted(o)[(len(o) - 1) // 2] for boot, o in by_boot.items()}
    return [0.0 if boot is None else common[boot] - offset for boot, offset in clocks]


def merge(trace_dir: Path) -> Tuple[Path, List[Dict[str, Any]]]:
    """Merge every trace file of ``trace_dir`` into ``merged.json``, each machine's files on one
    clock offset; returns (path, events)."""
    merged: List[Dict[str, Any]] = []
    files = [load_events(path) for path in trace_files(trace_dir)]
    shifts = clock_shifts([clock_of(events) for events in files])
    for index, (events, shift) in enumerate(zip(files, shifts), start=1):
        for ev in events:
            ev = dict(ev)
            ev["pid"] = index  # one process per file, whatever node it ran on
            if shift and ev.get("ph") != "M" and "ts" in ev:
                ev["ts"] = ev["ts"] + shift
            merged.append(ev)
        merged.append(
            {"name": "process_sort_index", "ph": "M", "pid": index, "args": {"sort_index": index}}
        )
    out = trace_dir / MERGED
    tmp = out.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "traceEvents": merged,
                "displayTimeUnit": "ms",
                "otherData": {
                    "producer": "raylab trace",
                    "clock": "wall time, microseconds; one offset per machine",
                    "clock_shift_us": shifts,
                },
            },
            separators=(",", ":"),
        )
    )
    tmp.replace(out)
    return out, merged


# ---------------------------------------------------------------------------- the summary


def names(events: List[Dict[str, Any]]) -> Tuple[Dict[int, str], Dict[Tuple[int, int], str]]:
    """(pid -> process name, (pid, tid) -> thread name) from the metadata events."""
    procs, threads = {}, {}
    for ev in events:
        if ev.get("ph") != "M":
            continue
        if ev["name"] == "process_name":
            procs[ev["pid"]] = ev["args"].get("name", str(ev["pid"]))
        elif ev["name"] == "thread_name":
            threads[(ev["pid"], ev.get("tid"))] = ev["args"].get("name", str(ev.get("tid")))
    return procs, threads


def intervals(events, name: str, process_prefix: str = "") -> List[Tuple[float, float]]:
    """The (start, end) µs of every complete event called ``name`` in processes whose name
    starts with ``process_prefix``."""
    procs, _ = names(events)
    return [
        (ev["ts"], ev["ts"] + ev["dur"])
        for ev in events
        if ev.get("ph") == "X"
        and ev["name"] == name
        and procs.get(ev["pid"], "").startswith(process_prefix)
    ]


def union(spans: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[Tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_us(a: List[Tuple[float, float]], b: List[Tuple[float, float]]) -> float:
    """Total time (µs) covered by both sets of intervals."""
    ua, ub = union(a), union(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if hi > lo:
            total += hi - lo
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per process and track, each phase's count, total and share of the track's iteration
    wall (``Iter Wall`` of a learner, ``Rollout Wall`` of an EnvRunner); and how much of the
    learners' Learning ran while an EnvRunner sampled."""
    procs, threads = names(events)
    per: Dict[Tuple[int, int], Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for ev in events:
        if ev.get("ph") == "X":
            per[(ev["pid"], ev["tid"])][ev["name"]].append(ev["dur"])
    tracks = []
    for (pid, tid), phases in sorted(per.items()):
        wall_name = next((w for w in ("Iter Wall", "Rollout Wall") if w in phases), None)
        wall = sum(phases[wall_name]) if wall_name else 0.0
        parent = per.get((pid, tid - NESTED_TRACK), {}) if tid >= NESTED_TRACK else {}
        if "Env Step" in parent:  # a nested track: its parts as shares of their Env Steps
            wall_name, wall = "Env Step", sum(parent["Env Step"])
        rows = []
        for name, durs in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
            total = sum(durs)
            rows.append(
                {
                    "phase": name,
                    "count": len(durs),
                    "total_s": total / 1e6,
                    "mean_ms": total / len(durs) / 1e3,
                    "share_of_wall": (total / wall)
                    if wall and (name != wall_name or parent)
                    else None,
                }
            )
        tracks.append(
            {
                "process": procs.get(pid, str(pid)),
                "track": threads.get((pid, tid))
                or (threads.get((pid, tid - NESTED_TRACK), str(tid)) + " · nested"),
                "wall": wall_name,
                "phases": rows,
            }
        )
    learning = intervals(events, "Learning", "Learner")
    sampling = intervals(events, "Rollout Wall", "EnvRunner")
    both = overlap_us(learning, sampling)
    learn_total = sum(b - a for a, b in union(learning))
    sample_total = sum(b - a for a, b in union(sampling))
    return {
        "tracks": tracks,
        "overlap": {
            "learning_s": learn_total / 1e6,
            "sampling_s": sample_total / 1e6,
            "learning_while_sampling_s": both / 1e6,
            "share_of_learning": both / learn_total if learn_total else None,
            "share_of_sampling": both / sample_total if sample_total else None,
        },
    }


def print_summary(summary: Dict[str, Any], out_path: Path, n_files: int) -> None:
    print(f"raylab: merged {n_files} trace file(s) into {out_path} (open it in ui.perfetto.dev)")
    for track in summary["tracks"]:
        wall = f" (shares of {track['wall']})" if track["wall"] else ""
        print(f"\n{track['process']} / {track['track']}{wall}")
        print(f"  {'phase':<22} {'count':>8} {'total s':>9} {'mean ms':>9} {'share':>6}")
        for row in track["phases"][:12]:
            share = (
                f"{100 * row['share_of_wall']:5.1f}%" if row["share_of_wall"] is not None else ""
            )
            print(
                f"  {row['phase']:<22} {row['count']:>8} {row['total_s']:>9.2f} "
                f"{row['mean_ms']:>9.3f} {share:>6}"
            )
    ov = summary["overlap"]
    if ov["share_of_learning"] is not None and ov["share_of_sampling"] is not None:
        print(
            f"\noverlap: Learning and EnvRunner sampling ran at the same time for "
            f"{ov['learning_while_sampling_s']:.2f} s: {100 * ov['share_of_learning']:.0f}% of "
            f"the learners' {ov['learning_s']:.2f} s of Learning, "
            f"{100 * ov['share_of_sampling']:.0f}% of the {ov['sampling_s']:.2f} s of sampling"
        )


def main(run_dir: str) -> int:
    trace_dir = find_trace_dir(Path(run_dir))
    files = trace_files(trace_dir)
    out, events = merge(trace_dir)
    summary = summarize(events)
    (trace_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print_summary(summary, out, len(files))
    return 0
