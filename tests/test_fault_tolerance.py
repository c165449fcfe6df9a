"""Faults during real training on a real local head node (token authentication on).

1. An EnvRunner process is killed (SIGKILL) in the middle of training: RLlib's fault tolerance
   (restart_failed_env_runners) restarts it, training goes on (until the test stops it), and
   the restart is counted (Perf/env_runner_restarts in the event files and in run_summary.json).
2. The whole driver (`raylab train`) is killed (SIGKILL) after a checkpoint; `raylab train
   --resume RUN_DIR` restores the Tune experiment from that checkpoint and continues: step and
   iteration counters go on from the checkpoint's values, not from zero.
3. The Learner actor is killed (SIGKILL), for APPO and for SAC (whose replay lives in the
   Learner): RLlib does not restart Learners, so the trial fails and Tune restores it from its
   last checkpoint (training.max_failures); the counters go on from the checkpoint's values.
   SAC's replay is not part of the checkpoint here (algo.store_buffer_in_checkpoints off, the
   default): the restored Learner refills it from new samples (the transitions since the last
   checkpoint are sampled again).

The driver is the `raylab train` command joining the head (resources.ray_address), so killing
it leaves the cluster up, as on a real cluster. Each scenario runs once (module fixtures) and
several tests check what it left. The head is the session's (conftest.py); every process of
these runs is ended at the end of its scenario, also on failure.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest
from conftest import signal_ray_worker, wait_for_tune_snapshot
from heads import RAYLAB, LocalHead

from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 240  # a loaded 2-core machine takes 20-60 s to start a training


@pytest.fixture(scope="module")
def head(ray_head):
    return ray_head  # the session's head (conftest.py); each scenario waits for it to be idle


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run_summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _start_driver(
    head: LocalHead, run_dir: Path, log: Path, *overrides: str, algo: str = "appo"
) -> subprocess.Popen:
    cmd = [
        RAYLAB,
        "train",
        "--algo",
        algo,
        "--task",
        "Pendulum-v1",
        "env.num_envs=4",
        f"resources.ray_address={head.gcs_address}",
        "training.terminal=plain",
        f"training.log_dir={run_dir}",
        *overrides,
    ]
    return subprocess.Popen(
        cmd,
        env=head.env(),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _wait(
    predicate,
    timeout: float,
    what: str,
    proc: Optional[subprocess.Popen] = None,
    log: Optional[Path] = None,
):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


# ------------------------------------------------------------------------- EnvRunner killed


@pytest.fixture(scope="module")
def envrunner_killed(head, tmp_path_factory):
    """Train with 2 EnvRunners; SIGKILL raylab-envrunner-1 after iteration 3; once the run has
    counted the restart, put the new process in its manifest and trained 5 more iterations,
    stop it with SIGTERM (a graceful stop). Polled, not a fixed budget: on a loaded machine
    the restarted actor takes anything from 5 to 40 s to come up."""
    head.wait_idle()
    base = tmp_path_factory.mktemp("envrunner_kill")
    run_dir, log = base / "run", base / "driver.log"
    proc = _start_driver(
        head,
        run_dir,
        log,
        "resources.num_env_runners=2",
        "training.time_budget_s=300",  # a cap; the test stops the run itself
        "training.checkpoint_every=0",
        # Evaluation of the initial policy only (its assertions: the last test of this part).
        "training.eval_every=0",
        "training.eval_before_train=true",
        "training.eval_episodes=3",
    )
    try:
        at_kill = _wait(
            lambda: (s := _summary(run_dir)).get("training_iteration", 0) >= 3 and s,
            STARTUP_TIMEOUT_S,
            "iteration 3",
            proc,
            log,
        )
        victim = _wait(
            lambda: next(
                (
                    a
                    for a in head.actors()
                    if a.get("repr_name") == "raylab-envrunner-1" and a["state"] == "ALIVE"
                ),
                None,
            ),
            30,
            "the raylab-envrunner-1 actor in the state API",
            proc,
            log,
        )
        signal_ray_worker(int(victim["pid"]), signal.SIGKILL)

        def restarted(s: dict) -> bool:
            manifest = s.get("runtime_manifest") or {}
            runner = {r["index"]: r for r in manifest.get("env_runners", [])}.get(1, {})
            return (manifest.get("counters") or {}).get(
                "env_runner_restarts", 0
            ) >= 1 and runner.get("pid") not in (None, int(victim["pid"]))

        at_restart = _wait(
            lambda: restarted(s := _summary(run_dir)) and s,
            240,
            "the restart counted and the new EnvRunner in the manifest",
            proc,
            log,
        )
        _wait(
            lambda: (
                _summary(run_dir).get("training_iteration", 0)
                >= at_restart["training_iteration"] + 5
            ),
            120,
            "5 iterations after the restart",
            proc,
            log,
        )
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=180)
    finally:
        _kill_group(proc)
    actors_after = [a for a in head.actors() if a.get("repr_name") == "raylab-envrunner-1"]
    return {
        "rc": rc,
        "log": log.read_text(errors="replace"),
        "run_dir": run_dir,
        "at_kill": at_kill,
        "at_restart": at_restart,
        "victim": victim,
        "actors_after": actors_after,
    }


def test_killed_env_runner_is_restarted_and_training_continues(envrunner_killed):
    f = envrunner_killed
    assert f["rc"] == 0, f["log"][-4000:]
    summary = read_summary(f["run_dir"])
    assert summary["status"] == "interrupted"  # by the test's SIGTERM, not by the kill
    # Training went on well past the kill and the restart ...
    assert summary["training_iteration"] >= f["at_restart"]["training_iteration"] + 5
    assert summary["env_steps"] > f["at_restart"]["env_steps"] > f["at_kill"]["env_steps"]
    # ... with the same actor restarted in a new process (Ray actor restart, state API) ...
    assert any(int(a.get("num_restarts") or 0) >= 1 for a in f["actors_after"]), f["actors_after"]
    # ... which the run's manifest shows too (placement refreshed after the restart).
    runners = {r["index"]: r for r in summary["runtime_manifest"]["env_runners"]}
    assert set(runners) == {1, 2}
    assert runners[1]["pid"] != int(f["victim"]["pid"])


def test_env_runner_restart_is_counted_in_metrics_and_run_summary(envrunner_killed):
    f = envrunner_killed
    summary = read_summary(f["run_dir"])
    assert summary["final_metrics"][S.PERF_ENV_RUNNER_RESTARTS] >= 1
    # The event files: 0 before the kill, >= 1 after it, and steps still growing after that.
    column = extract(f["run_dir"]).column(S.PERF_ENV_RUNNER_RESTARTS)
    before = [step for step, v in column if v == 0]
    after = [step for step, v in column if v >= 1]
    assert before and after and max(before) < min(after)
    assert min(before) <= f["at_kill"]["env_steps"]
    assert max(after) >= f["at_restart"]["env_steps"]  # still counted after the restart


def test_runtime_manifest_counts_env_runner_restarts(envrunner_killed):
    summary = read_summary(envrunner_killed["run_dir"])
    assert summary["runtime_manifest"]["counters"]["env_runner_restarts"] >= 1


def test_eval_every_zero_evaluates_only_the_initial_policy(envrunner_killed):
    """training.eval_every=0 with eval_before_train (this scenario's run does not depend on
    evaluation): the initial policy's evaluation only, at step 0, and no best checkpoint.
    (Both off, no evaluation at all: tests/test_output.py's SIGTERM run.)"""
    run_dir = envrunner_killed["run_dir"]
    assert [step for step, _ in extract(run_dir).column(S.EVAL_MEAN_REWARD)] == [0]
    summary = read_summary(run_dir)
    assert "best_eval" not in summary and "initial_eval" in summary
    assert not (run_dir / "checkpoints" / "best").exists()


# ------------------------------------------------------------------------- driver killed


def checkpoint_counters(checkpoint: Path):
    """(training_iteration, env steps sampled) stored in an RLlib Algorithm checkpoint.

    RLlib 2.60 keeps them in algorithm_state.pkl: the iteration and the MetricsLogger state,
    whose lifetime sums are the counters a restored Algorithm continues from.
    """
    with open(checkpoint / "algorithm_state.pkl", "rb") as fh:
        state = pickle.load(fh)
    stats = state["metrics_logger"]["stats"]
    return int(state["training_iteration"]), int(
        stats["env_runners--num_env_steps_sampled_lifetime"]["lifetime_sum"]
    )


def _event_steps(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(S.PERF_TOTAL_FPS)]


DRIVER_KILL_STEPS = 100_000  # 30-80 s of APPO on Pendulum-v1 with 4 envs (1,200-3,000 steps/s):
# at 30,000 the run could finish before the kill (10 iterations at 3,000 steps/s)


@pytest.fixture(scope="module")
def driver_killed_and_resumed(head, tmp_path_factory):
    """Train (a budget of DRIVER_KILL_STEPS env steps, checkpoint every 10 iterations of about
    1,200 steps); SIGKILL the driver once Tune's experiment state has recorded the first
    checkpoint (the next one is 10 iterations away), then `raylab train --resume RUN_DIR`.

    The budget is in env steps, not seconds: on a loaded machine the first checkpoint came
    after 24 s of a 25 s budget, and the resumed run had nothing left to train.
    """
    head.wait_idle()
    base = tmp_path_factory.mktemp("driver_kill")
    run_dir, log = base / "run", base / "driver.log"
    # No evaluation: a new best evaluation checkpoints at once, and this scenario needs the
    # next checkpoint to be at least 3 s away when it kills the driver.
    proc = _start_driver(
        head,
        run_dir,
        log,
        f"training.total_steps={DRIVER_KILL_STEPS}",
        "training.time_budget_s=300",  # a cap
        "training.checkpoint_every=10",
        "training.eval_every=0",
        "training.eval_before_train=false",
    )
    try:
        _wait(
            lambda: _summary(run_dir).get("last_checkpoint"),
            STARTUP_TIMEOUT_S,
            "the first checkpoint",
            proc,
            log,
        )
        # Tune's next experiment snapshot records that checkpoint (the next checkpoint is
        # 10 iterations of >= 1 s away).
        wait_for_tune_snapshot(run_dir / "tune", after=time.time())
        # ... and the run is 3 iterations past the checkpoint's (the next checkpoint is 10
        # away), so that the kill throws work away (in CI the kill once came before the next
        # iteration had ended), and more than the resumed run's first iteration re-does
        # (APPO's iterations differ in size: one iteration past it was not always enough).
        checkpoints = sorted((run_dir / "tune").glob("*/checkpoint_*"))
        ckpt_iteration = checkpoint_counters(checkpoints[-1])[0]
        at_kill = _wait(
            lambda: (
                (s := _summary(run_dir)).get("training_iteration", 0) >= ckpt_iteration + 3 and s
            ),
            60,
            f"3 iterations after the checkpoint's ({ckpt_iteration})",
            proc,
            log,
        )
        _kill_group(proc)
    finally:
        _kill_group(proc)
    # Read before resuming: the resumed run rotates old checkpoints away (num_to_keep).
    counters = checkpoint_counters(checkpoints[-1]) if checkpoints else None
    first_events = sorted(run_dir.glob("events.out.tfevents.*"))
    # The driver's actors die with it (fate sharing); wait until their CPUs are free again.
    _wait(
        lambda: (
            not [
                a
                for a in head.actors()
                if a["state"] == "ALIVE" and (a.get("repr_name") or "").startswith("raylab-")
            ]
        ),
        60,
        "the killed driver's actors to end",
    )
    resume = subprocess.run(
        [RAYLAB, "train", "--resume", str(run_dir)],
        env=head.env(),
        capture_output=True,
        text=True,
        timeout=420,
    )
    return {
        "run_dir": run_dir,
        "log": log.read_text(errors="replace"),
        "at_kill": at_kill,
        "checkpoints": checkpoints,
        "counters": counters,
        "first_events": first_events,
        "resume": resume,
    }


def test_driver_kill_then_resume_continues_from_the_last_checkpoint(driver_killed_and_resumed):
    f = driver_killed_and_resumed
    r = f["resume"]
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    at_kill, checkpoints = f["at_kill"], f["checkpoints"]
    assert checkpoints and at_kill.get("status") == "running"
    last = checkpoints[-1]
    assert at_kill["last_checkpoint"] == str(last)
    # Tune restored the newest checkpoint on disk when the driver died, and raylab said so.
    restored = re.findall(r"raylab: restoring trial \S+ from checkpoint (\S+)", r.stderr)
    assert restored == [str(last)], (restored, r.stderr[-3000:])

    summary = read_summary(f["run_dir"])
    assert summary["restored_from"] == [str(last)]
    assert summary["status"] == "completed"
    ckpt_iteration, ckpt_steps = f["counters"]
    # The budget counts the steps before the kill too: the resumed driver sampled less than it.
    assert summary["env_steps"] >= DRIVER_KILL_STEPS > summary["env_steps"] - ckpt_steps
    assert summary["training_iteration"] > at_kill["training_iteration"] > ckpt_iteration
    assert summary["env_steps"] > at_kill["env_steps"] > ckpt_steps


def test_resume_keeps_the_step_counters(driver_killed_and_resumed):
    f = driver_killed_and_resumed
    ckpt_iteration, ckpt_steps = f["counters"]
    events = sorted(f["run_dir"].glob("events.out.tfevents.*"))
    resumed = [e for e in events if e not in f["first_events"]]
    assert len(f["first_events"]) == 1 and len(resumed) == 1, events
    before, after = _event_steps(f["first_events"][0]), _event_steps(resumed[0])
    assert ckpt_steps in before  # the checkpointed iteration was logged before the kill
    # Every iteration the summary had recorded when the driver was killed is in its event file
    # (the callback flushes the writer before it updates the summary).
    assert before[-1] >= f["at_kill"]["env_steps"] and f["at_kill"]["env_steps"] in before
    # The resumed driver's first step continues from the checkpoint's counter (not from 0),
    # and it re-does the steps after the checkpoint that the kill threw away.
    assert ckpt_steps <= after[0] < before[-1]
    assert after == sorted(after) and after[-1] == read_summary(f["run_dir"])["env_steps"]
    # The reader merges both files: for a re-logged step the resumed value wins.
    table = extract(f["run_dir"])
    # (step 0: the initial policy's evaluation, before any iteration)
    assert table.steps == sorted({0} | set(before) | set(after))


# ------------------------------------------------------------------------- Learner killed


@pytest.fixture(scope="module", params=["appo", "sac"])
def learner_killed(request, head, tmp_path_factory):
    """Train (20 s budget, checkpoint every 3 iterations); after the first checkpoint and
    iteration 5, SIGKILL the Learner actor (raylab-learner-0). RLlib does not restart Learners:
    the trial fails, and Tune restores it from its last checkpoint (training.max_failures)."""
    algo = request.param
    head.wait_idle()
    base = tmp_path_factory.mktemp(f"learner_kill_{algo}")
    run_dir, log = base / "run", base / "driver.log"
    proc = _start_driver(
        head,
        run_dir,
        log,
        "training.time_budget_s=20",
        "training.checkpoint_every=3",
        "training.eval_every=0",
        "training.eval_before_train=false",
        algo=algo,
    )
    try:
        at_kill = _wait(
            lambda: (
                (s := _summary(run_dir)).get("last_checkpoint")
                and s.get("training_iteration", 0) >= 5
                and s
            ),
            STARTUP_TIMEOUT_S,
            "a checkpoint and iteration 5",
            proc,
            log,
        )
        victim = _wait(
            lambda: next(
                (
                    a
                    for a in head.actors()
                    if a.get("repr_name") == "raylab-learner-0" and a["state"] == "ALIVE"
                ),
                None,
            ),
            30,
            "the raylab-learner-0 actor in the state API",
            proc,
            log,
        )
        signal_ray_worker(int(victim["pid"]), signal.SIGKILL)
        # The newest checkpoint at the kill, read before later ones rotate it away.
        last = _summary(run_dir)["last_checkpoint"]
        counters = checkpoint_counters(Path(last))
        rc = proc.wait(timeout=400)
    finally:
        _kill_group(proc)
    return {
        "last_checkpoint": last,
        "counters": counters,
        "algo": algo,
        "rc": rc,
        "log": log.read_text(errors="replace"),
        "run_dir": run_dir,
        "at_kill": at_kill,
        "victim": victim,
    }


def test_killed_learner_the_trial_is_restored_from_its_last_checkpoint(learner_killed):
    f = learner_killed
    assert f["rc"] == 0, f["log"][-4000:]
    summary = read_summary(f["run_dir"])
    assert summary["status"] == "completed"
    restored = summary.get("restored_from") or []
    assert len(restored) == 1, summary
    assert "raylab: restoring trial" in f["log"]
    # Restored from a checkpoint taken at or before the kill, and nothing before it was lost:
    # the counters go on from the checkpoint's values and the run reaches its budget.
    assert restored == [f["last_checkpoint"]]  # the newest checkpoint when the Learner died
    ckpt_iteration, ckpt_steps = f["counters"]
    assert ckpt_iteration >= 3 and ckpt_steps > 0
    assert summary["training_iteration"] > max(ckpt_iteration, f["at_kill"]["training_iteration"])
    assert summary["env_steps"] > f["at_kill"]["env_steps"]
    assert summary["time_total_s"] >= 20
    # A new Learner process trained after the restore.
    learners = summary["runtime_manifest"]["learners"]
    assert learners and all(int(x["pid"]) != int(f["victim"]["pid"]) for x in learners)
