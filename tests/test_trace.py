"""Traces (``training.trace_*``, ``raylab trace``): the trace-event files a real run writes, read
back against the trace-event format (Perfetto's UI cannot be fetched here), and the writer on
its own (open arrays of killed processes, thread CPU time, bad files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import run_main

from raylab.errors import UserError
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics.extract import extract
from raylab.metrics.timeline import Timeline, label
from raylab.metrics.trace_merge import event_problem, load_events, merge, names, overlap_us


@pytest.fixture
def tracer(tmp_path):
    trace.shutdown()
    trace.configure({"dir": str(tmp_path), "thread_time": True}, "unit", "Unit process")
    yield tmp_path
    trace.shutdown()


def test_timeline_phases_nest_in_their_iteration_with_thread_cpu_time(tracer):
    tl = Timeline("trace_unit", S.LEARNER_MAIN_PHASES["sac"], S.PERF_ITERATION_TIME)
    tl.bind_to_current_thread("unit main timeline")
    for _ in range(3):
        tl.boundary()
        with tl.phase(S.PERF_LEARNER_COLLECTOR_WAIT_MS):
            time.sleep(0.002)
        with tl.phase(S.PERF_LEARNING_TIME):
            sum(i * i for i in range(20000))
    tl.boundary()
    trace.shutdown()
    (path,) = tracer.glob("*.trace.json")
    events = json.loads(path.read_text())  # closed: plain JSON
    assert all(event_problem(e) is None for e in events)
    iters = [e for e in events if e.get("name") == label(S.PERF_ITERATION_TIME)]
    phases = [e for e in events if e.get("cat") == "phase"]
    assert len(iters) == 3 and len(phases) == 6
    for p in phases:
        assert any(i["ts"] <= p["ts"] and p["ts"] + p["dur"] <= i["ts"] + i["dur"] for i in iters)
        assert p["args"]["thread_cpu_ms"] >= 0
    learning = [p for p in phases if p["name"] == "Learning"]
    assert all(p["args"]["thread_cpu_ms"] > 0 for p in learning)
    procs, threads = names(events)
    assert procs[os.getpid()] == "Unit process"
    assert "unit main timeline" in threads.values()


def test_a_killed_process_leaves_a_readable_open_array(tmp_path):
    code = (
        "import time, sys\n"
        "from raylab.metrics import trace\n"
        f"trace.configure({{'dir': {str(tmp_path)!r}}}, 'victim', 'Victim')\n"
        "for i in range(600):\n"
        "    t = time.perf_counter(); trace.complete('Env Step', t, t + 1e-4, 'collector')\n"
        "trace.active().flush(); print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (path,) = tmp_path.glob("victim-*.trace.json")
    assert not path.read_text().rstrip().endswith("]")
    events = load_events(path)
    assert sum(e["name"] == "Env Step" for e in events) == 600
    out, merged = merge(tmp_path)
    assert json.loads(out.read_text())["traceEvents"] == merged


def test_an_event_cut_off_by_a_kill_is_dropped_from_an_open_array(tracer):
    """A process killed in the middle of a write leaves its last event cut off; the reader
    keeps every complete event of the open array. A closed file is read fail-closed."""
    for _ in range(3):
        t = time.perf_counter()
        trace.complete("Env Step", t, t + 1e-4, "collector")
    trace.active().flush()
    (path,) = tracer.glob("*.trace.json")
    whole = path.read_text()
    assert whole.rstrip().endswith("}")  # an open array that ends on a complete event
    path.write_text(whole + ',\n{"name":"Reset Done","ca')
    assert sum(e["name"] == "Env Step" for e in load_events(path)) == 3
    path.write_text(whole + ',\n{"name":"Reset Done","ca\n]\n')  # closed, yet broken
    with pytest.raises(UserError, match="not trace-event JSON"):
        load_events(path)


def test_events_from_many_threads_are_each_on_their_own_named_track(tracer):
    def work(name):
        trace.name_thread(name)
        for _ in range(50):
            with trace.span("Replay Write", "collector"):
                pass

    threads = [threading.Thread(target=work, args=(f"worker {i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trace.shutdown()
    events = load_events(next(tracer.glob("*.trace.json")))
    tids = {e["tid"] for e in events if e.get("ph") == "X"}
    assert len(tids) == 4
    _, tracks = names(events)
    assert {tracks[(os.getpid(), tid)] for tid in tids} == {f"worker {i}" for i in range(4)}


def test_formatted_events_read_back_as_the_values_written(tracer):
    """The writer formats events itself (no dict, no json.dumps per event): names that need
    escaping, negative durations, explicit tracks and args must still read back exactly."""
    tr = trace.active()
    t0 = time.perf_counter()
    tr.complete('Env "Step" · nested\\part', t0, t0 + 0.0125, "collector")
    tr.complete("Physics", t0 + 1.0, t0 + 0.5, "nested", track=trace.nested_track())
    tr.complete("Learning", t0, t0 + 0.001, "phase", args={"thread_cpu_ms": 0.75, "n": "x"})
    trace.shutdown()
    events = load_events(next(tracer.glob("*.trace.json")))
    assert all(event_problem(e) is None for e in events)
    xs = [e for e in events if e.get("ph") == "X"]
    assert [e["name"] for e in xs] == ['Env "Step" · nested\\part', "Physics", "Learning"]
    assert [e["cat"] for e in xs] == ["collector", "nested", "phase"]
    assert xs[0]["dur"] == pytest.approx(12500.0, abs=1e-3)
    assert xs[0]["ts"] == pytest.approx(tr.us(t0), abs=1e-3)
    assert xs[1]["dur"] == 0.0 and xs[1]["tid"] == trace.nested_track()
    assert xs[0]["tid"] == threading.get_native_id() == xs[2]["tid"]
    assert xs[2]["args"] == {"thread_cpu_ms": 0.75, "n": "x"}
    assert all(e["pid"] == os.getpid() for e in xs)


def test_bad_trace_files_fail_closed_with_one_line(tmp_path, cli):
    bad = tmp_path / "traces"
    bad.mkdir()
    (bad / "learner-1.trace.json").write_text('[{"name": "Learning", "ph": "X", "pid": 1}]')
    with pytest.raises(UserError, match="event 0: no numeric ts"):
        load_events(bad / "learner-1.trace.json")
    r = cli("trace", str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "learner-1.trace.json" in r.stderr and "Traceback" not in r.stderr
    r = cli("trace", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_the_files_of_one_machine_are_merged_on_one_clock_offset(tmp_path, monkeypatch):
    """Each process reads wall time minus perf_counter once; a process descheduled between the
    two reads (or a wall-clock step between two processes' starts) gets an offset off by that
    much, and its phases would show early or late against the others': a PPO run on a loaded CI
    machine showed Learning overlapping sampling that way. The merge puts the files of one boot
    id on their median offset, and leaves a file of another machine on its own."""
    assert trace.wall_offset_us() == pytest.approx(
        (time.time() - time.perf_counter()) * 1e6, abs=2e3
    )
    t0 = time.perf_counter()
    measured = trace.wall_offset_us()
    tracers = []
    for role, misread_us in (("a", 0.0), ("b", 50_000.0), ("c", 0.0), ("d", 80_000.0)):
        # b read its two clocks 50 ms apart (the reading itself cannot be paused on demand)
        monkeypatch.setattr(trace, "wall_offset_us", lambda m=misread_us: measured + m)
        tracers.append(trace.Tracer(str(tmp_path), role, role.title()))
    for tr in tracers:
        tr.complete("Learning", t0, t0 + 0.01, "phase")
    for tr in tracers:
        tr.close()
    other = tracers[3].path  # a file of another machine: its own clock, left as it is
    other.write_text(other.read_text().replace(trace.boot_id(), "another-machine"))
    _, events = merge(tmp_path)
    procs, _ = names(events)
    ts = {procs[e["pid"]]: e["ts"] for e in events if e.get("ph") == "X"}
    assert ts["A"] == ts["B"] == ts["C"] == pytest.approx(tracers[0].us(t0), abs=1e-3)
    assert ts["D"] == pytest.approx(tracers[0].us(t0) + 80_000.0, abs=1e-3)


def test_overlap_of_interval_sets():
    assert overlap_us([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert overlap_us([(0, 10)], [(10, 20)]) == 0


# ------------------------------------------------------------------- a real traced run


@pytest.fixture(scope="module")
def traced(golden):
    """The golden microduck_balance run of an algorithm (traced, conftest.py), merged by
    `raylab trace` on first use."""
    merged = {}

    def get(algo):
        run_dir = golden(algo, "microduck_balance")
        if algo not in merged:
            r = run_main("trace", str(run_dir))
            assert r.returncode == 0, r.stderr
            assert "merged" in r.stdout and "overlap:" in r.stdout
            merged[algo] = True
        return run_dir

    return get


def _learner_tracks(events):
    """{(pid, tid): [events]} of the learner main-timeline tracks (those with Iter Wall)."""
    procs, _ = names(events)
    tracks = {}
    for e in events:
        if e.get("ph") == "X" and procs.get(e["pid"], "").startswith("Learner"):
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    return {k: v for k, v in tracks.items() if any(e["name"] == "Iter Wall" for e in v)}


@pytest.mark.parametrize("algo", ["appo", "sac", "ppo"])
def test_a_healthy_run_closes_every_trace_file(golden, algo):
    """Every process of a run that ended normally closed its JSON array: each file is plain
    JSON (the open arrays of killed processes are the reader's business, tested above)."""
    files = sorted((golden(algo, "microduck_balance") / "traces").glob("*.json"))
    files = [p for p in files if p.name != "merged.json"]
    assert any(p.name.startswith("env_runner") for p in files), files
    open_files = []
    for path in files:
        try:
            json.loads(path.read_text())
        except ValueError:
            open_files.append(path.name)
    assert not open_files, f"left open by a healthy {algo} run: {open_files}"


@pytest.mark.parametrize("algo", ["appo", "sac", "ppo"])
def test_a_real_runs_trace_has_every_process_and_its_main_phases_nest(traced, algo):
    run_dir = traced(algo)
    merged = json.loads((run_dir / "traces" / "merged.json").read_text())
    events = merged["traceEvents"]
    assert merged["displayTimeUnit"] == "ms"
    assert all(event_problem(e) is None for e in events)
    procs, _ = names(events)
    assert "Algorithm (driver loop)" in procs.values()
    assert "EnvRunner 1" in procs.values() and "Learner 0" in procs.values()
    # Every event name of a phase is the schema's label (or raylab's driver-loop spans).
    labels = {spec.label for spec in S.TAGS.values() if spec.label}
    driver = {"Algorithm Step", "Training Step", "Evaluation"}
    assert {e["name"] for e in events if e.get("ph") == "X"} <= labels | driver

    (track,) = _learner_tracks(events).values()
    main = set(label(t) for t in S.LEARNER_MAIN_PHASES[algo])
    iters = sorted((e for e in track if e["name"] == "Iter Wall"), key=lambda e: e["ts"])
    # Phases of the iteration still open when the run stopped have no Iter Wall to sit in.
    closed_until = iters[-1]["ts"] + iters[-1]["dur"]
    phases = sorted(
        (e for e in track if e["name"] in main and e["ts"] < closed_until), key=lambda e: e["ts"]
    )
    assert len(iters) >= 3 and phases
    eps = 1.0  # µs: timestamps are rounded to ns, phases touch their neighbours
    for p in phases:  # inside an iteration ...
        assert any(
            i["ts"] - eps <= p["ts"] and p["ts"] + p["dur"] <= i["ts"] + i["dur"] + eps
            for i in iters
        ), p
    for a, b in zip(phases, phases[1:]):  # ... and never overlapping each other
        assert a["ts"] + a["dur"] <= b["ts"] + eps, (a, b)
    # Per iteration the main phases account for at most its wall.
    for i in iters:
        inside = [p for p in phases if i["ts"] - eps <= p["ts"] <= i["ts"] + i["dur"]]
        assert sum(p["dur"] for p in inside) <= i["dur"] + eps * (len(inside) + 1)
    # The trace's iterations are the ones Perf/iteration_time reports (seconds).
    reported = sorted(extract(run_dir).values[S.PERF_ITERATION_TIME].values())
    traced_s = sorted(i["dur"] / 1e6 for i in iters)
    med_r, med_t = reported[len(reported) // 2], traced_s[len(traced_s) // 2]
    # Same quantity and unit: the medians agree within a few times (a reported value is the
    # mean of its window, which one slow iteration on a loaded machine pulls up; a unit or
    # event mix-up is off by 1,000 or more).
    assert 0.2 < med_t / med_r < 5.0, (med_t, med_r)
    # Thread CPU time is on the phases (training.trace_thread_time=true).
    assert all("thread_cpu_ms" in p.get("args", {}) for p in phases)


@pytest.mark.parametrize("algo", ["appo", "sac"])
def test_collector_and_learner_tracks_overlap_in_the_asynchronous_algorithms(traced, algo):
    summary = json.loads((traced(algo) / "traces" / "summary.json").read_text())
    overlap = summary["overlap"]
    shorter = min(overlap["learning_s"], overlap["sampling_s"])
    assert shorter > 0
    # Most of the shorter of the two activities runs while the other one does.
    assert overlap["learning_while_sampling_s"] > 0.5 * shorter, overlap


def test_ppo_learning_does_not_overlap_sampling(traced):
    # PPO samples, then learns: the same reader that shows APPO's overlap shows none here.
    summary = json.loads((traced("ppo") / "traces" / "summary.json").read_text())
    overlap = summary["overlap"]
    shorter = min(overlap["learning_s"], overlap["sampling_s"])
    assert shorter > 0
    assert overlap["learning_while_sampling_s"] < 0.05 * shorter, overlap


def test_background_and_nested_work_sit_on_their_own_tracks(traced):
    events = json.loads((traced("appo") / "traces" / "merged.json").read_text())["traceEvents"]
    _, threads = names(events)
    by_name = {}
    for e in events:
        if e.get("ph") == "X":
            by_name.setdefault(e["name"], set()).add((e["pid"], e["tid"]))
    # Env Step's parts on the EnvRunner's nested track, not on the Env Step track.
    (nested,) = by_name[label(S.PERF_COLLECTOR_BACKEND_STEP_MS)]
    assert threads[nested].endswith("· nested")
    assert nested not in by_name[label(S.PERF_COLLECTOR_ENV_STEP_MS)]
    # APPO's episode ingest runs on the request thread beside the learner thread.
    (ingest,) = by_name[label(S.PERF_LEARNER_INGEST_MS)]
    assert ingest not in by_name["Learning"]
    assert "background" in threads[ingest]


class _FakeCudaEvent:
    """Stands in for torch.cuda.Event: there is no GPU on this machine, so the CUDA-event
    path is checked against a fake device clock (the only mock in this file)."""

    clock_ms = 0.0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self):
        _FakeCudaEvent.clock_ms += 1.5  # the device runs 1.5 ms between any two records
        self.at = _FakeCudaEvent.clock_ms

    def synchronize(self):
        pass

    def query(self):
        return self.at is not None

    def elapsed_time(self, other):
        return other.at - self.at


def test_cuda_events_put_device_time_on_a_cuda_track(tmp_path):
    import types

    trace.shutdown()
    trace.configure({"dir": str(tmp_path)}, "gpu", "GPU learner")
    tracer = trace.active()
    tracer.cuda = trace.CudaEvents(tracer, types.SimpleNamespace(Event=_FakeCudaEvent))
    tl = Timeline("trace_cuda", S.LEARNER_MAIN_PHASES["sac"], S.PERF_ITERATION_TIME)
    tl.boundary()
    for _ in range(3):
        with tl.phase(S.PERF_LEARNING_TIME):
            pass
    tl.boundary()
    trace.shutdown()
    events = load_events(next(tmp_path.glob("*.trace.json")))
    cuda = [e for e in events if e.get("cat") == "cuda"]
    assert [e["name"] for e in cuda] == ["Learning"] * 3
    assert all(abs(e["dur"] - 1500.0) < 1e-6 for e in cuda)  # 1.5 ms of device time each
    assert len({e["tid"] for e in cuda}) == 1
    assert names(events)[1][(os.getpid(), cuda[0]["tid"])].startswith("CUDA")
