"""``raylab soak``: its artifact read fail-closed, and every failure class produced by its own
injected fault in a real run (real Ray, real kills, real signals).

The real runs are ``raylab soak`` drivers joining the session's Ray head (conftest.py): the
soak watches its own job's actors there, as it would on a shared cluster."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RAYLAB, head_driver_env, signal_ray_worker

from raylab.errors import UserError
from raylab.soak import FAILURE_CLASSES, parse_duration, read_soak, slope, validate_soak

PASSED = {
    "schema_version": "0.3.0",
    "metric_schema_version": 1,
    "runtime_manifest_schema_version": 1,
    "windows": [
        {
            "index": 0,
            "start_s": 0.0,
            "end_s": 5.0,
            "env_steps": 100,
            "env_steps_per_s": 20.0,
            "restarts": 0,
        },
    ],
    "failure_classification": None,
    "failure_reason": None,
    "passed": True,
    "shutdown": {
        "classification": "normal_completion",
        "owner": "driver",
        "phase": "budget",
        "cleanup_errors": [],
    },
    "producer_snapshots": [],
}


def _broken(**changes):
    d = copy.deepcopy(PASSED)
    for key, value in changes.items():
        if value is KeyError:
            del d[key]
        else:
            d[key] = value
    return d


@pytest.mark.parametrize(
    "d, message",
    [
        (_broken(schema_version="0.2.0"), "schema_version '0.2.0'; this reader accepts 0.3.0"),
        (_broken(metric_schema_version=2), "metric_schema_version 2; accepted: 1"),
        (_broken(runtime_manifest_schema_version=None), "runtime_manifest_schema_version None"),
        (_broken(windows=KeyError), "missing 'windows'"),
        (_broken(windows=[{"index": 0}]), r"windows\[0\].start_s must be a finite number"),
        (
            _broken(failure_classification="oom", passed=False, failure_reason="x"),
            "failure_classification 'oom'",
        ),
        (_broken(passed=False), "passed must be true exactly when"),
        (_broken(shutdown=None), "a pass needs shutdown.classification normal_completion"),
        (_broken(shutdown={**PASSED["shutdown"], "owner": ""}), "non-empty shutdown.owner"),
        (_broken(shutdown={**PASSED["shutdown"], "cleanup_errors": ["x"]}), "cleanup_errors"),
        (_broken(failure_classification="resource_leak", passed=False), "needs its failure_reason"),
    ],
)
def test_a_soak_artifact_is_read_fail_closed(d, message):
    with pytest.raises(UserError, match=message):
        validate_soak(d)


def test_a_valid_artifact_and_every_class_validate(tmp_path, cli):
    validate_soak(PASSED)
    for cls in FAILURE_CLASSES:
        validate_soak(_broken(failure_classification=cls, passed=False, failure_reason="why"))
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(PASSED))
    r = cli("soak", "--check", str(path))
    assert r.returncode == 0 and "passed" in r.stdout
    path.write_text(json.dumps(_broken(schema_version="9")))
    r = cli("soak", "--check", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_durations_and_slopes():
    assert parse_duration("90", "x") == 90 and parse_duration("30m", "x") == 1800
    assert parse_duration("2h", "x") == 7200
    for bad in ("0", "-5m", "ten", "5d"):
        with pytest.raises(UserError, match="positive duration"):
            parse_duration(bad, "--duration")
    assert slope([0, 1, 2], [1, 3, 5]) == pytest.approx(2.0)
    assert slope([1, 1], [0, 5]) is None


@pytest.mark.parametrize("mb_per_s, leak", [(1.0, True), (0.0, False)])
def test_a_rising_object_store_is_a_resource_leak(tmp_path, monkeypatch, mb_per_s, leak):
    """The monitor's windows fed directly (no run): the object store's use is judged like an
    actor's memory, by its slope over the windows after warm-up."""
    from raylab import soak as soak_mod
    from raylab.reporting import StopRequest

    stops = []
    monkeypatch.setattr(StopRequest, "request", classmethod(lambda cls, *a: stops.append(a)))
    m = soak_mod.Monitor(
        tmp_path, window_s=10, stale_s=1e6, leak_mb_per_min=5, warmup_s=0, leak_span_s=30
    )
    m._first_tick = m._last_tick = time.monotonic()
    for i in range(6):
        t = 10.0 * (i + 1)
        m._samples = [
            {"t": x, "env_steps": int(100 * x), "iteration": i, "actors": {}, "object_store_mb": y}
            for x, y in ((t - 5, 2 + mb_per_s * (t - 5)), (t, 2 + mb_per_s * t))
        ]
        m._close_window(0.0)
    assert m.memory_slopes()[soak_mod.OBJECT_STORE] == pytest.approx(60 * mb_per_s, abs=1e-6)
    m._check()
    if leak:
        assert m.classification == "resource_leak" and "object store" in m.reason, m.reason
        assert len(stops) == 1
    else:
        assert m.classification is None and not stops


def test_bad_soak_options_are_one_line(cli):
    r = cli("soak", "--duration", "0")
    assert r.returncode == 2 and "--duration=0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("soak", "--duration", "30s", "--window", "60s")
    assert r.returncode == 2 and "longer than --duration" in r.stderr
    r = cli("soak", "resources.dashboard=false")
    assert r.returncode == 2 and "state API" in r.stderr


# ------------------------------------------------------------------ real runs, real faults

COMMON = [
    "resources.dashboard=true",
    "training.terminal=plain",
    "training.checkpoint_every=5",
    # nothing here reads an evaluation
    "training.eval_every=0",
    "training.eval_before_train=false",
]
real_run = pytest.mark.slow  # a real run with an injected fault: `make test` only


@pytest.fixture
def head(idle_head):
    return idle_head


class Soak:
    """A ``raylab soak`` process of its own (its own session) joining the shared head, and its
    run directory. ``args``: soak options first, then config overrides (argparse takes the
    overrides as one group)."""

    def __init__(self, tmp_path: Path, head, *args: str, duration="75s", window="5s"):
        self.head = head
        self.run_dir = tmp_path / "run"
        self.log = tmp_path / "soak.log"
        cmd = [
            RAYLAB,
            "soak",
            "--duration",
            duration,
            "--window",
            window,
            *args,
            f"training.log_dir={self.run_dir}",
            *COMMON,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=head_driver_env(head),
        )

    def manifest(self, timeout=240):
        """The runtime manifest once the first result is in (actor pids)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                m = json.loads((self.run_dir / "run_summary.json").read_text())["runtime_manifest"]
                if m and m["env_runners"] and m["learners"]:
                    return m
            except (OSError, ValueError, KeyError):
                pass
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            time.sleep(1)
        raise AssertionError("no runtime manifest in time:\n" + self.log.read_text()[-3000:])

    def result(self, timeout=400):
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError("soak did not end:\n" + self.log.read_text()[-3000:]) from None
        artifact = read_soak(self.run_dir / "soak.json")  # validates fail-closed
        return code, artifact, self.log.read_text()


def _failed_as(code, artifact, output, classification):
    assert code != 0, output[-2000:]
    assert artifact["failure_classification"] == classification, (artifact, output[-2000:])
    assert artifact["passed"] is False and artifact["failure_reason"]
    assert f"soak failed: {classification}" in output


@real_run
def test_a_healthy_soak_passes(tmp_path, cli, head):
    soak = Soak(tmp_path, head, duration="18s", window="3s")
    code, a, output = soak.result()
    assert code == 0, output[-3000:]
    assert a["passed"] and a["failure_classification"] is None
    assert a["shutdown"]["classification"] == "normal_completion"
    windows = a["windows"]
    assert len(windows) >= 6
    moving = [w for w in windows if w["env_steps_per_s"] > 0]
    assert len(moving) >= 4 and a["throughput"]["band_env_steps_per_s"][0] > 0
    last = windows[-1]
    classes = {x["class"] for x in last["actors"].values()}
    assert any("EnvRunner" in c for c in classes), classes
    assert all(x["rss_mb_last"] > 10 for x in last["actors"].values() if x.get("rss_mb_last"))
    assert last["object_store_mb"] is not None
    # Which actor restarted, and the run's log, if one did (seen once in a clean clone).
    restarted = {n: x for n, x in last["actors"].items() if x.get("restarts")}
    assert last["restarts"] == 0, (restarted, output[-3000:])
    assert "soak passed" in output
    r = cli("soak", "--check", str(soak.run_dir / "soak.json"))
    assert r.returncode == 0 and "passed" in r.stdout


@real_run
def test_a_killed_learner_is_a_learner_failure(tmp_path, head):
    soak = Soak(tmp_path, head, "training.max_failures=0")
    pid = soak.manifest()["learners"][0]["pid"]
    time.sleep(3)
    signal_ray_worker(pid, signal.SIGKILL)  # for good: no trial restore (max_failures=0)
    _failed_as(*soak.result(), "learner_failure")


@real_run
def test_envrunners_killed_beyond_their_restarts_are_a_collector_failure(tmp_path, head):
    soak = Soak(tmp_path, head, "training.max_env_runner_restarts=0", "training.max_failures=0")
    pid = soak.manifest()["env_runners"][0]["pid"]
    time.sleep(3)
    signal_ray_worker(pid, signal.SIGKILL)
    _failed_as(*soak.result(), "collector_failure")


@real_run
def test_a_stopped_envrunner_is_a_stale_tick(tmp_path, head):
    soak = Soak(tmp_path, head, "--stale", "15s", duration="150s")
    pid = soak.manifest()["env_runners"][0]["pid"]
    time.sleep(3)
    signal_ray_worker(pid, signal.SIGSTOP)  # alive but silent: no more env steps
    try:
        code, a, output = soak.result()
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    _failed_as(code, a, output, "timeout/stale_tick")
    assert a["monitor_classification"] == "timeout/stale_tick"
    assert "no progress" in a["failure_reason"]


@real_run
def test_a_cancelled_job_is_an_external_cancellation(tmp_path, head):
    soak = Soak(tmp_path, head, duration="150s")
    soak.manifest()
    time.sleep(3)
    os.kill(soak.proc.pid, signal.SIGTERM)  # what `ray job stop` sends the job's driver
    code, a, output = soak.result()
    _failed_as(code, a, output, "external_cancellation")
    assert a["shutdown"]["owner"] == "external (SIGTERM)"
    assert a["run_status"] == "interrupted"


@real_run
def test_a_leaking_env_is_a_resource_leak(tmp_path, head):
    soak = Soak(
        tmp_path,
        head,
        *("--leak-mb-per-min", "60", "--warmup", "6s", "--leak-span", "12s"),
        "env.debug_leak_kb_per_step=64",
        duration="150s",
        window="3s",
    )
    code, a, output = soak.result()
    _failed_as(code, a, output, "resource_leak")
    leak = a["failure_reason"]
    assert "EnvRunner" in leak, leak
    slopes = a["memory_slope_mb_per_min"]
    runner = max((v for k, v in slopes.items() if "EnvRunner" in k), default=0)
    assert runner > 60


@real_run
def test_a_failing_physics_worker_is_a_backend_worker_failure(tmp_path, head):
    # Two physics threads, so the failing one is a worker thread of the backend's pool.
    soak = Soak(tmp_path, head, "env.num_threads=2", "env.debug_fail_backend_after_steps=300")
    code, a, output = soak.result()
    _failed_as(code, a, output, "backend_worker_failure")
    assert "injected physics failure" in a["failure_reason"], a["failure_reason"]


@real_run
def test_the_algorithm_actor_killed_is_an_unknown_failure(tmp_path, head):
    soak = Soak(tmp_path, head, "training.max_failures=0")
    soak.manifest()
    time.sleep(3)
    # The Algorithm's own actor (class RaylabAPPO): neither the collector nor the learner
    # side, so the run cannot say which owner began the failure.
    (algo,) = [
        a
        for a in head.actors()
        if a["state"] == "ALIVE" and (a.get("class_name") or "").startswith("RaylabAPPO")
    ]
    signal_ray_worker(int(algo["pid"]), signal.SIGKILL)
    _failed_as(*soak.result(), "unknown_failure")
