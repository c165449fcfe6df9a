"""Shared test fixtures."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
RAYLAB = shutil.which("raylab", path=os.path.dirname(sys.executable)) or "raylab"


def run_cli(*args: str, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run the installed `raylab` console command in a subprocess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [RAYLAB, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout
    )


def run_main(*args: str) -> SimpleNamespace:
    """``raylab.cli.main`` in this process, for tests whose subject is not the console script
    itself: the exit code it returns and what it printed (no interpreter start, no imports)."""
    from raylab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def wait_for_tune_snapshot(root: Path, after: float, timeout: float = 30.0) -> None:
    """Poll until Tune has written its experiment state (which checkpoint a resume restores)
    somewhere under ``root`` later than ``after`` (time.time()), whole: Tune rewrites the file
    in place, and a driver killed while it was half written left an empty file, from which a
    resume starts a new trial instead. Tune snapshots at most every TUNE_GLOBAL_CHECKPOINT_S
    (5 s, set by raylab.train.init_ray)."""
    import json
    import time

    def written(path: Path) -> bool:
        try:
            return path.stat().st_mtime > after and bool(json.loads(path.read_text()))
        except (OSError, ValueError):
            return False

    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(written(p) for p in root.rglob("experiment_state*.json")):
            return
        time.sleep(0.2)
    raise AssertionError(f"Tune wrote no experiment state under {root} within {timeout:.0f} s")


# What a healthy run must not print: a traceback, an ERROR line, a library warning.
NOT_RAYLAB = re.compile(r"Traceback|ERROR|WARNING|Warning\b|warn\(")


def assert_only_raylab_output(output: str) -> None:
    """A healthy run printed raylab's lines only (and the sweep's table): no traceback, no
    ERROR line, no warning of Ray, RLlib, MuJoCo or another library."""
    bad = [line for line in output.splitlines() if NOT_RAYLAB.search(line)]
    assert not bad, "\n".join(bad[:20]) + "\n---\n" + output[-4000:]


def signal_ray_worker(pid: int, sig: int) -> None:
    """Signal the Ray worker process behind a pid read from the state API or a run's manifest,
    checking first that the pid still is a Ray worker (its title starts with ``ray::``): this
    machine kind's pid_max is 32,768 and the suite starts thousands of processes (the pids of a
    clean-clone run wrapped in its first 8 minutes), so an ended worker's pid is soon another
    process's, which a kill or a SIGSTOP must never reach."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        raise AssertionError(f"pid {pid} has ended before its signal {sig}") from None
    assert title.startswith(b"ray::"), f"pid {pid} is no longer a Ray worker: {title[:80]!r}"
    os.kill(pid, sig)


@pytest.fixture
def cli():
    return run_cli


# ---------------------------------------------------------------------- the in-process Ray
# One Ray started in the test process, for the tests that call Ray or RLlib here (actors of
# their own, an Algorithm built in process, the dashboard gauges on the node's metrics
# endpoint). Started on first use, shut down at the end of the session. (Multi-node
# cluster_utils.Clusters run in subprocesses of their own: tests/test_cluster_placement.py.)
IN_PROCESS_CPUS = 4


class InProcessRay:
    def __init__(self):
        self.metrics_url = None
        self.temp_dir = None

    def ensure(self) -> "InProcessRay":
        import socket
        import tempfile

        import ray

        if ray.is_initialized():
            return self
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.temp_dir = tempfile.mkdtemp(prefix="rlp", dir="/tmp")  # short: socket path limit
        ray.init(
            address="local",
            num_cpus=IN_PROCESS_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=self.temp_dir,
            _metrics_export_port=port,
            _system_config={"metrics_report_interval_ms": 500},
        )
        node = ray.nodes()[0]
        self.metrics_url = (
            f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        )
        return self

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


@pytest.fixture(scope="session")
def _in_process_ray():
    holder = InProcessRay()
    yield holder
    holder.shutdown()


@pytest.fixture
def ray_in_process(_in_process_ray):
    """The test process's Ray (IN_PROCESS_CPUS CPUs, metrics exported every 0.5 s)."""
    return _in_process_ray.ensure()


# ---------------------------------------------------------------------- the shared Ray head
# One real `ray start --head` (token authentication on) for every test that submits jobs or
# joins a cluster as a driver: jobs, resources, fault tolerance, soak, env errors and the
# golden runs. Sized for the largest scenario (two EnvRunners, a Learner and the algorithm's
# own actor of a fault-tolerance run: 4 CPUs); `ray job stop` waits 120 s before its SIGKILL,
# as the cluster configs set it, so a stopped run can checkpoint; the head's workers import
# the test envs of tests/fixtures (faulty_env). Started on first use, stopped at the end.
FIXTURES = REPO / "tests" / "fixtures"
HEAD_CPUS = 4


@pytest.fixture(scope="session")
def ray_head():
    from heads import LocalHead

    pythonpath = os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")]))
    head_env = {"RAY_JOB_STOP_WAIT_TIME_S": "120", "PYTHONPATH": pythonpath}
    with LocalHead(num_cpus=HEAD_CPUS, head_env=head_env) as head:
        yield head


@pytest.fixture
def idle_head(ray_head):
    """The shared head with nothing of an earlier test left on it."""
    ray_head.wait_idle()
    yield ray_head


def head_driver_env(head) -> dict:
    """Environment of a `raylab` driver that joins the shared head (token and address)."""
    env = head.env()
    env["RAY_ADDRESS"] = head.gcs_address
    return env


# ---------------------------------------------------------------------- the golden runs
# Each (algorithm, task) trains once per test session, on first use, and the train, trace,
# manifest, checkpoint, eval and metrics tests read what it left: PPO, APPO and SAC on a
# Gymnasium id and on microduck_balance (the robot runs traced). The runs join the shared
# head (the local-Ray path of `raylab train` is the subject of tests/test_output.py).
GOLDEN_ALGOS = ("ppo", "appo", "sac")
GOLDEN_TASKS = ("Pendulum-v1", "microduck_balance")
EVAL_EVERY, EVAL_EPISODES = 3, 4
OUTPUT_FILE = "output.txt"  # what `raylab train` printed, next to its run directory
# Small, fast settings per algorithm so each run does several iterations in its budget.
FAST = {
    "ppo": ["algo.train_batch_size=512", "algo.minibatch_size=128", "algo.num_epochs=2"],
    "appo": ["algo.train_batch_size=256"],
    "sac": ["algo.learning_starts=200", "algo.batch_size=64"],
}
COMMON = [
    "resources.dashboard=false",
    "training.terminal=plain",
    "training.checkpoint_every=2",
    "algo.hidden=[64,64]",
    f"training.eval_every={EVAL_EVERY}",
    f"training.eval_episodes={EVAL_EPISODES}",
    # The readers count evaluations by iteration: the in-line path, whose timing is exact
    # (evaluation beside training, the default, has its own run: test_eval_background.py).
    "training.eval_background=false",
    "training.episode_log=true",
]
TRACED = ("training.trace_enabled=true", "training.trace_thread_time=true")


def train_run(
    base: Path, algo: str, task: str, seconds: float, extra=(), env=None, timeout=600
) -> Path:
    """`raylab train` of a small run into base/run; what it printed goes to base/output.txt."""
    run_dir = base / "run"
    r = run_cli(
        "train",
        "--algo",
        algo,
        "--task",
        task,
        f"training.log_dir={run_dir}",
        f"training.time_budget_s={seconds}",
        "env.num_envs=4",
        *COMMON,
        *FAST[algo],
        *extra,
        env=env,
        timeout=timeout,
    )
    (base / OUTPUT_FILE).write_text(r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"run directory: {run_dir}" in r.stderr
    return run_dir


@pytest.fixture(scope="session")
def golden(tmp_path_factory, ray_head):
    """golden(algo, task) -> the run directory of that golden run (trained on first use)."""
    cache = {}

    def get(algo: str, task: str = "Pendulum-v1") -> Path:
        if (algo, task) not in cache:
            ray_head.wait_idle()
            base = tmp_path_factory.mktemp(f"golden_{algo}_{task.replace('/', '_')}")
            extra, seconds = (), 10
            if task == "microduck_balance":  # traced: at least three learner iterations
                extra, seconds = TRACED, 14
            if (algo, task) == ("sac", "microduck_balance"):
                # SAC samples about 60-150 env steps/s here and a Microduck episode is 250
                # steps: 24 s, so that every env ends its first episode (1,000 steps on 4
                # envs: Train/mean_reward is there) and the trace has its learner iterations
                # (a 1,200-step run was over in 9 s, 7 iterations, on a quiet machine).
                seconds = 24
            cache[algo, task] = train_run(
                base, algo, task, seconds, extra, env=head_driver_env(ray_head)
            )
        return cache[algo, task]

    return get


# ---------------------------------------------------------------------- two at a time
# `make test` runs the suite on two pytest-xdist workers: most real-run scenarios spend much of
# their wall time waiting (a budget, a poll, Ray starting), so two of them share the machine's
# cores well. Each worker has its own session fixtures (its own shared head, its own in-process
# Ray), so a module goes to one worker whole (its module fixtures run once) and the modules
# that read the golden runs go to the same worker (each golden run trains once): the scheduler
# below. (xdist's own `--dist loadgroup` does not group under pytest 9.) A test whose result
# depends on having the machine to itself (a learning run on a wall-clock budget) is marked
# `alone`; `make test` runs those afterwards.
GOLDEN_READERS = ("test_train.py", "test_trace.py")
# The modules' own time on two workers (seconds, 2026-12-03): the heaviest start first, so that
# no long module is left to start last while the other worker idles. Only the order depends on
# these numbers; a module missing here starts after them.
MODULE_SECONDS = {
    "golden": 670,
    "test_soak.py": 490,
    "test_fault_tolerance.py": 460,
    "test_sweep.py": 425,
    "test_env_errors.py": 330,
    "test_bench.py": 235,
    "test_sac.py": 235,
    "test_output.py": 225,
    "test_progress.py": 225,
    "test_cluster_placement.py": 165,
    "test_jobs.py": 105,
    "test_gym_learning.py": 110,
    "test_eval_background.py": 80,
    "test_multi_learner.py": 70,
    "test_tune_futures.py": 40,
}


def _scope(module: str) -> str:
    name = Path(module).name
    return "golden" if name in GOLDEN_READERS else name


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: heaviest modules first (stable)
        items.sort(key=lambda item: -MODULE_SECONDS.get(_scope(item.path.name), 0))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep the workers' order (above)

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "golden" if module.endswith(GOLDEN_READERS) else module

        def remove_node(self, node):
            """A worker is gone: at the end, or crashed inside a test. xdist's scope scheduler
            would queue the crashed test again with the rest of its module, and the worker
            that replaces the crashed one would run it again (and crash, or hang, again). It
            is reported failed once (xdist's crash report) and its module's other tests go on."""
            workload = self.assigned_work.pop(node)
            crashed = None
            for unit in workload.values():
                crashed = next((nodeid for nodeid, done in unit.items() if not done), None)
                if crashed is not None:
                    unit[crashed] = True
                    break
            rest = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
            if rest:
                self.workqueue.update(rest)
                for other in self.assigned_work:
                    self._reschedule(other)
            return crashed

    return ModuleScheduling(config, log)


# ---------------------------------------------------------------------- where the time went
# The controller (or a run without workers) sums each module's test time and each worker's busy
# time and prints them at the end: with MODULE_SECONDS above, what a slow suite needs to see
# (the heaviest modules, and whether one worker ran long after the other had finished).
_TIMING = {"start": None, "modules": {}, "workers": {}}


def pytest_sessionstart(session):
    import time

    _TIMING["start"] = time.monotonic()


def pytest_runtest_logreport(report):
    import time

    node = getattr(report, "node", None)  # xdist: the worker that ran the test
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    module = _scope(report.nodeid.split("::", 1)[0])
    _TIMING["modules"][module] = _TIMING["modules"].get(module, 0.0) + report.duration
    _say_failure(report)
    busy, _ = _TIMING["workers"].get(worker, (0.0, 0.0))
    _TIMING["workers"][worker] = (busy + report.duration, time.monotonic() - _TIMING["start"])


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput") or not _TIMING["modules"]:
        return
    tr = terminalreporter
    tr.section("where the time went")
    for worker, (busy, last) in sorted(_TIMING["workers"].items()):
        tr.write_line(f"{worker}: busy {busy:,.0f} s, its last test ended at {last:,.0f} s")
    top = sorted(_TIMING["modules"].items(), key=lambda kv: -kv[1])[:15]
    tr.write_line("heaviest modules (s): " + ", ".join(f"{m} {t:,.0f}" for m, t in top))


# ------------------------------------------------------------ hangs and crashes, said at once
# pytest-timeout (pyproject.toml) raises in a test's own thread; a test blocked inside native
# code (a C++ wait of Ray, the join of a library's thread) never returns to the interpreter to
# see it. So a watchdog thread (faulthandler's) prints every thread's stack and ends the process
# WATCHDOG_GRACE_S after the test's own limit: under xdist the worker is reported crashed on that
# test and the suite goes on, instead of waiting out CI's limit. And the controller names each
# failed or crashed test the moment it reports, not only in the summary at the end (which a run
# killed from outside never prints).
WATCHDOG_GRACE_S = float(os.environ.get("RAYLAB_TEST_WATCHDOG_GRACE_S", 300))
_STDERR = {}


def pytest_configure(config):
    _STDERR["fd"] = os.dup(sys.__stderr__.fileno())  # the terminal, whatever capture does
    _STDERR["config"] = config


def test_limit_s(item) -> float:
    """The item's pytest-timeout limit: its own `timeout` mark, else the ini value."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import faulthandler

    limit = test_limit_s(item)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + WATCHDOG_GRACE_S, exit=True, file=_STDERR["fd"])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _say_failure(report) -> None:
    config = _STDERR.get("config")
    if config is None or hasattr(config, "workerinput"):
        return  # a worker: its controller says it
    if report.failed:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        line = f"\nFAILED {report.nodeid} ({report.when}, {report.duration:.0f} s, {worker})\n"
        os.write(_STDERR["fd"], line.encode())


# The tests started and not yet finished, for a run stopped from outside (`make test` stops its
# first phase with SIGINT after TEST_PHASE_LIMIT_S, Makefile): which ones it was waiting for.
_RUNNING = {}


def pytest_runtest_logstart(nodeid, location):
    import time

    _RUNNING[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    _RUNNING.pop(nodeid, None)


def pytest_keyboard_interrupt(excinfo):
    import time

    if hasattr(_STDERR["config"], "workerinput"):
        return  # the controller says it
    now = time.monotonic()
    for nodeid, t0 in _RUNNING.items():
        os.write(_STDERR["fd"], f"\nSTILL RUNNING {nodeid} (for {now - t0:.0f} s)\n".encode())


# ---------------------------------------------------------------------- the end of the session
# One full-suite run (599 passed) then died with a segmentation fault in the interpreter's own
# finalization, after pytest had printed its summary: native threads of the libraries the tests
# load in this process (torch, MuJoCo's worker pools, Ray's core worker) being torn down in an
# order Python does not control. Every test had reported by then, so the session ends with its
# own exit status without that finalization; a crash inside a test still shows as one (pytest's
# faulthandler prints the stacks).
_EXIT_STATUS = {}


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if "status" not in _EXIT_STATUS or os.environ.get("RAYLAB_TEST_NORMAL_EXIT"):
        return
    from raylab.quiet import flush_std_streams

    flush_std_streams()
    os._exit(_EXIT_STATUS["status"])
