"""What a run prints and how it ends on a signal: real `raylab train` processes with their own
local Ray (the path a user's terminal takes: Ctrl-C reaches the whole process group), real
signals.

- A stop signal (Ctrl-C = SIGINT to the terminal's process group; SIGTERM to the raylab
  process, as `kill` or a job's supervisor sends it) ends APPO and SAC runs after the current
  iteration, a long iteration at its next learner update: the final checkpoint is written
  after the signal, run_summary.json is complete and says why the run stopped, and the process
  exits within 10 s of that checkpoint, printing nothing but raylab's lines. The interrupted
  run resumes from a relative path to its budget.
- A second Ctrl-C aborts at once (exit code 130) and still leaves a readable, closed summary.
- SAC on Gymnasium's HalfCheetah-v5 (whose model file carries a MuJoCo deprecation notice)
  prints raylab's lines only.

`ray job stop` (SIGTERM through Ray's job supervisor) is tests/test_jobs.py's; the healthy-run
output of PPO, APPO and SAC on a raylab task and on Pendulum-v1 is checked by
tests/test_train.py on the golden runs; the sweep's by tests/test_sweep.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RAYLAB, assert_only_raylab_output, run_cli

from raylab.metrics.rundir import read_summary

pytestmark = pytest.mark.slow

EXIT_AFTER_CHECKPOINT_S = 10  # the bound docs/training.md states
STARTUP_TIMEOUT_S = 240  # a loaded 2-core machine takes 20-60 s to start a training
SMALL = [
    "resources.dashboard=false",
    "training.terminal=plain",
    "training.time_budget_s=600",  # the signal ends the run, not the budget
    "training.checkpoint_every=0",  # the only checkpoint is the one the stop writes
    "training.eval_every=0",
    "training.eval_before_train=false",
    "algo.hidden=[32,32]",
]


def _start(
    tmp_path: Path,
    algo: str,
    *extra: str,
    iterations: int = 2,
    task: str = "microduck_balance",
    envs: int = 8,
):
    run_dir, log = tmp_path / "run", tmp_path / "output.txt"
    out = open(log, "w")
    proc = subprocess.Popen(
        [RAYLAB, "train", "--algo", algo, "--task", task]
        + [f"training.log_dir={run_dir}", f"env.num_envs={envs}", *SMALL, *extra],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    out.close()
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline and proc.poll() is None:
        try:
            if read_summary(run_dir).get("training_iteration", 0) >= iterations:
                return proc, run_dir, log
        except Exception:
            pass
        time.sleep(0.3)
    _end(proc)
    tail = log.read_text()[-3000:]
    raise AssertionError(f"no iteration {iterations} in {STARTUP_TIMEOUT_S} s:\n{tail}")


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_and_wait(proc: subprocess.Popen, sig: str, group: bool, timeout: float) -> float:
    """Send ``sig`` to the run (its process group, or the process alone), wait for it to exit;
    the time it exited. The process is killed if it is still there afterwards."""
    try:
        (os.killpg if group else os.kill)(proc.pid, getattr(signal, sig))
        proc.wait(timeout=timeout)
        return time.time()
    finally:
        _end(proc)


def _newest_file_time(folder: Path) -> float:
    return max(f.stat().st_mtime for f in folder.rglob("*") if f.is_file())


def _assert_stopped_by(sig, proc, run_dir, log, sent, exited) -> dict:
    """What a stop signal leaves: exit code 0, a closed summary that says why the run stopped,
    the final checkpoint written after the signal, the exit within 10 s of that checkpoint,
    and raylab's lines only."""
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    summary = read_summary(run_dir)  # validates the file against the summary schema
    assert summary["status"] == "interrupted"
    expected = {"SIGINT": "user_interrupt", "SIGTERM": "external_cancellation"}[sig]
    assert summary["stop_reason"] == expected
    assert summary["end_time"] and summary["final_metrics"] and summary["runtime_manifest"]
    checkpoint = Path(summary["last_checkpoint"])
    assert (checkpoint / "algorithm_state.pkl").is_file()
    written = _newest_file_time(checkpoint)
    assert written >= sent, "the final checkpoint predates the signal"
    assert exited - written <= EXIT_AFTER_CHECKPOINT_S, (exited - written, output[-3000:])
    assert "raylab: stopping after this iteration" in output
    assert f"raylab: run interrupted; logs, summary and checkpoints in {run_dir}" in output
    assert_only_raylab_output(output)
    return summary


def test_ctrl_c_cuts_a_long_iteration_short_checkpoints_and_the_run_resumes_to_its_budget(
    tmp_path,
):
    """Ctrl-C (SIGINT to the terminal's process group) in the middle of a long APPO iteration
    (training.iteration_s=20: RLlib repeats training steps until then): the stop reaches the
    algorithm through the run's board, so the iteration ends after its current training step
    (which ends with a learner update), not 18 s later; the cut iteration is reported and
    saved, the summary closed, the process gone within 10 s of the final checkpoint. Then
    `raylab train --resume run` from the run's parent folder continues the (interrupted) trial
    from that checkpoint to its 30 s budget."""
    from raylab.metrics import schema as S
    from raylab.metrics.extract import extract

    proc, run_dir, log = _start(
        tmp_path, "appo", "training.iteration_s=20", "training.time_budget_s=30", iterations=1
    )
    time.sleep(2)  # well inside the second iteration
    sent = time.time()
    exited = _signal_and_wait(proc, "SIGINT", group=True, timeout=180)
    stopped = _assert_stopped_by("SIGINT", proc, run_dir, log, sent, exited)
    assert stopped["training_iteration"] == 2  # the cut iteration is reported and saved
    assert exited - sent < 15, (exited - sent, log.read_text()[-3000:])
    assert stopped["time_total_s"] < 30, stopped

    r = run_cli("train", "--resume", run_dir.name, cwd=tmp_path, timeout=600)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-3000:]
    assert_only_raylab_output(output)
    assert f"from checkpoint {stopped['last_checkpoint']}" in output
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["stop_reason"] is None
    assert summary["time_total_s"] >= 30
    assert summary["training_iteration"] > stopped["training_iteration"]
    assert summary["restored_from"] == [stopped["last_checkpoint"]]
    # The resumed driver's first throughput is one iteration's, not the restored lifetime
    # count over one iteration's time (this machine's physics alone runs about 10,000 steps/s).
    fps = extract(run_dir).column(S.PERF_TOTAL_FPS)
    assert fps and max(v for _, v in fps) < 50_000, fps


def test_sigterm_stops_sac_on_a_gymnasium_mujoco_env_after_its_iteration(tmp_path):
    """SIGTERM to the raylab process alone (`kill PID`, a job's supervisor) ends a SAC run on
    Gymnasium's HalfCheetah-v5 (whose model file carries a MuJoCo deprecation notice) after
    the current iteration; every line it printed is raylab's."""
    proc, run_dir, log = _start(tmp_path, "sac", task="HalfCheetah-v5", envs=4)
    sent = time.time()
    exited = _signal_and_wait(proc, "SIGTERM", group=False, timeout=180)
    summary = _assert_stopped_by("SIGTERM", proc, run_dir, log, sent, exited)
    output = log.read_text()
    foreign = [line for line in output.splitlines() if line and not line.startswith("raylab")]
    assert not foreign, "\n".join(foreign[:20])
    # Evaluation off (training.eval_every=0, eval_before_train=false): none at all.
    from raylab.metrics import schema as S
    from raylab.metrics.extract import extract

    assert S.EVAL_MEAN_REWARD not in extract(run_dir).tags
    assert "best_eval" not in summary and "initial_eval" not in summary
    assert not (run_dir / "checkpoints" / "best").exists()


def test_a_second_ctrl_c_aborts_at_once_and_leaves_a_closed_summary(tmp_path):
    proc, run_dir, log = _start(tmp_path, "appo")
    os.killpg(proc.pid, signal.SIGINT)
    # The second Ctrl-C as soon as the first one is handled: while the run is still stopping
    # (a fixed pause let a loaded machine finish the graceful stop first).
    deadline = time.time() + 30
    while "raylab: stopping after this iteration" not in log.read_text():
        assert time.time() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.02)
    second = time.time()
    exited = _signal_and_wait(proc, "SIGINT", group=True, timeout=60)
    output = log.read_text()
    assert proc.returncode == 130, output[-3000:]
    assert exited - second <= EXIT_AFTER_CHECKPOINT_S, output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "user_abort"
    assert summary["end_time"]
    assert "raylab: interrupted" in output
    assert "Traceback" not in output, output[-3000:]
