"""Evaluation beside training (``training.eval_background``, the default): the periodic
evaluations run on an idle-priority thread of the algorithm's process while the iterations go
on, their results come with a later iteration, and the best checkpoint still holds exactly the
weights that earned the logged score.

One run of its own (APPO on microduck_balance, traced, joining the shared head): the golden runs
pin the in-line path, whose readers count evaluations by iteration."""

from __future__ import annotations

import json
import os
import threading

import pytest
from conftest import head_driver_env, run_cli

from raylab.algorithms.algorithm import idle_priority
from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary
from raylab.metrics.timeline import label
from raylab.metrics.trace_merge import load_events, names, overlap_us

EVERY, EPISODES = 4, 8


def test_idle_priority_holds_for_the_thread_and_the_threads_it_starts():
    """The evaluation thread's physics threads start from it, so they inherit its priority;
    the thread that called is untouched."""
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this platform")
    seen = {}

    def child():
        seen["child"] = os.sched_getscheduler(0)

    def evaluation_thread():
        seen["ok"] = idle_priority()
        seen["self"] = os.sched_getscheduler(0)
        t = threading.Thread(target=child)
        t.start()
        t.join()

    t = threading.Thread(target=evaluation_thread)
    t.start()
    t.join()
    assert seen == {"ok": True, "self": os.SCHED_IDLE, "child": os.SCHED_IDLE}
    assert os.sched_getscheduler(0) != os.SCHED_IDLE


@pytest.fixture(scope="module")
def beside(tmp_path_factory, ray_head):
    """A 30-s APPO run with an evaluation due every 4 iterations, beside training."""
    ray_head.wait_idle()
    run_dir = tmp_path_factory.mktemp("eval_background") / "run"
    r = run_cli(
        "train",
        "--algo",
        "appo",
        "--task",
        "microduck_balance",
        f"training.log_dir={run_dir}",
        "training.time_budget_s=30",
        "env.num_envs=4",
        "algo.train_batch_size=256",
        "algo.hidden=[64,64]",
        f"training.eval_every={EVERY}",
        f"training.eval_episodes={EPISODES}",
        "training.checkpoint_every=0",
        "training.trace_enabled=true",
        "resources.dashboard=false",
        "training.terminal=plain",
        env=head_driver_env(ray_head),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir


def test_evaluations_beside_training_are_logged_after_the_initial_one(beside):
    evals = extract(beside).column(S.EVAL_MEAN_REWARD)
    steps = [step for step, _ in evals]
    assert steps[0] == 0  # the initial policy's, in line before the first update
    assert len(steps) >= 2 and steps == sorted(set(steps)), steps
    summary = read_summary(beside)  # (TensorBoard keeps float32)
    assert summary["initial_eval"][S.EVAL_MEAN_REWARD] == pytest.approx(evals[0][1], rel=1e-6)
    assert summary["best_eval"]["score"] == pytest.approx(max(v for s, v in evals[1:]), rel=1e-6)


def test_an_evaluation_ran_while_the_algorithm_trained(beside):
    """The trace: the evaluation's event lies on the evaluation thread, and training steps ran
    during it (in line, the algorithm's thread would wait for it)."""
    (path,) = (beside / "traces").glob("algorithm-*.trace.json")
    events = load_events(path)
    _, threads = names(events)
    evals = [e for e in events if e.get("name") == label(S.PERF_EVALUATION_MS)]
    beside_ones = [
        e for e in evals if threads.get((e["pid"], e.get("tid"))) == "evaluation beside training"
    ]
    assert beside_ones, [threads.get((e["pid"], e.get("tid"))) for e in evals]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "Training Step"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in beside_ones]
    assert overlap_us(spans, steps) > 0


def test_the_best_checkpoint_replays_an_evaluation_beside_training(beside):
    """The weights synced to the evaluation EnvRunner when it started are what the best
    checkpoint holds, though the Learner trained on while the evaluation ran."""
    best = read_summary(beside)["best_eval"]
    r = run_cli(
        "eval",
        str(beside),
        "--checkpoint",
        "best",
        "--episodes",
        str(EPISODES),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((beside / "eval.json").read_text())
    assert got["mean_return"] == pytest.approx(best["score"], rel=1e-9, abs=1e-9)
