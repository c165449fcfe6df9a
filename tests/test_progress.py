"""Progress metrics through the real path: the reward window, evaluation during training, the
best checkpoint and the learning-curve plot.

The runs train PPO with real Ray and RLlib on the probe env ``raylab/CountingEpisodes-v0``
(raylab.envs.probe): every episode lasts ``L`` steps and returns its ordinal within its env
(1, 2, 3, ...), so what each report must say is known from the env step counts alone. Two
EnvRunners with one env each sample in lockstep (PPO: ``train_batch_size / 2`` steps each per
iteration), so after ``s`` env steps every EnvRunner has finished ``floor(s / 2 / L)`` episodes
and both ship the same ordinals: the window's content does not depend on the order in which
the two EnvRunners' episodes arrive.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import head_driver_env, run_cli

from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary

L = 150  # probe episode length
WINDOW = 5
BATCH = 200  # env steps per PPO iteration: 100 per EnvRunner
EVAL_EVERY, EVAL_EPISODES = 5, 4
TOTAL = 3000  # 15 iterations
PROBE = [
    "--algo",
    "ppo",
    "--task",
    "raylab/CountingEpisodes-v0",
    "env.num_envs=1",
    "resources.num_env_runners=2",
    f"env.kwargs.length={L}",
    f"algo.train_batch_size={BATCH}",
    "algo.minibatch_size=100",
    "algo.num_epochs=1",
    "algo.hidden=[8]",
    "training.iteration_s=0",
    f"training.reward_window={WINDOW}",
    f"training.eval_every={EVAL_EVERY}",
    f"training.eval_episodes={EVAL_EPISODES}",
    "training.eval_background=false",  # evaluations at exact iterations
    "training.checkpoint_every=0",
    "resources.dashboard=false",
    "training.terminal=plain",
]


def expected_window(steps: int, window: int = WINDOW, runners: int = 2):
    """Mean of the latest ``window`` episode returns after ``steps`` env steps (None before the
    first episode ends)."""
    items = []
    done = 0
    for s in range(BATCH, steps + 1, BATCH):  # report by report
        now = (s // runners) // L
        for _ in range(runners):  # every EnvRunner ships ordinals done+1 .. now
            items += list(range(done + 1, now + 1))
        done = now
    return float(np.mean(items[-window:])) if items else None


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, ray_head):
    ray_head.wait_idle()
    run_dir = tmp_path_factory.mktemp("probe") / "run"
    r = run_cli(
        "train",
        *PROBE,
        f"training.total_steps={TOTAL}",
        f"training.log_dir={run_dir}",
        env=head_driver_env(ray_head),  # the session's Ray head (conftest.py)
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir


def test_train_mean_reward_is_the_window_over_reports_and_env_runners(probe_run):
    table = extract(probe_run)
    got = dict(table.column(S.TRAIN_MEAN_REWARD))
    steps = [s for s in table.steps if s > 0]
    assert steps == list(range(BATCH, TOTAL + 1, BATCH))
    for s in steps:
        want = expected_window(s)
        if want is None:  # omitted until the first episode completes
            assert s not in got, (s, got.get(s))
        else:
            assert got[s] == pytest.approx(want, rel=1e-6), (s, got[s], want)
    # The window spans reports: with 2 new episodes per report (one per EnvRunner) a window of
    # 5 mixes three reports, so it differs from the mean of the latest report's episodes.
    s = TOTAL
    latest_report = float((s // 2) // L)
    assert got[s] != pytest.approx(latest_report)
    lengths = dict(table.column(S.TRAIN_MEAN_EPISODE_LENGTH))
    assert set(lengths.values()) == {float(L)}


def test_eval_before_training_and_every_n_iterations(probe_run):
    table = extract(probe_run)
    evals = dict(table.column(S.EVAL_MEAN_REWARD))
    # Once before the first update (at step 0), then after iterations 5, 10, 15 only.
    want_steps = [0] + [i * BATCH for i in range(EVAL_EVERY, TOTAL // BATCH + 1, EVAL_EVERY)]
    assert sorted(evals) == want_steps
    # The evaluation env lives on between evaluations; each evaluation runs one episode per
    # env, so the k-th evaluation's probe episodes all return k.
    assert [evals[s] for s in want_steps] == [1.0, 2.0, 3.0, 4.0]
    assert set(dict(table.column(S.EVAL_MEAN_EPISODE_LENGTH)).values()) == {float(L)}
    assert S.EVAL_SURVIVAL not in table.tags  # the probe is not a robot: no survival


def test_best_evaluation_and_its_checkpoint(probe_run):
    summary = read_summary(probe_run)
    best = summary["best_eval"]
    assert best["score"] == 4.0 and best["training_iteration"] == 15
    assert best["env_steps"] == TOTAL
    assert Path(best["checkpoint"]) == probe_run / "checkpoints" / "best"
    assert summary["initial_eval"][S.EVAL_MEAN_REWARD] == 1.0
    # The kept copy is a complete checkpoint that `raylab eval` loads.
    r = run_cli("eval", str(probe_run), "--checkpoint", "best", "--episodes", "3", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((probe_run / "eval.json").read_text())
    assert out["checkpoint"] == best["checkpoint"] and out["episodes"] == 3
    assert out["returns"] == [1.0, 1.0, 1.0]  # fresh envs: every first episode returns 1


def test_plot_draws_the_runs(probe_run, tmp_path):
    out = tmp_path / "curve.png"
    r = run_cli("plot", str(probe_run), str(probe_run), "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_refuses_a_directory_that_is_not_a_run(tmp_path):
    r = run_cli("plot", str(tmp_path), timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "not a raylab run directory" in r.stderr.strip().splitlines()[-1]


def test_window_and_best_eval_survive_a_restore(tmp_path, ray_in_process):
    """The window and the best evaluation are checkpoint state: an algorithm restored from a
    checkpoint (what `raylab train --resume` does through Tune) goes on with them. Built in
    this process, on the test process's Ray (conftest.py)."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose
    from raylab.train import algorithm_class

    cfg = compose(
        "ppo",
        "raylab/CountingEpisodes-v0",
        "mujoco",
        [o for o in PROBE[4:] if "=" in o and not o.startswith("training.terminal")]
        + ["resources.num_env_runners=1"],
    )
    config = build_algorithm_config(cfg)
    algo = algorithm_class("ppo")(config=config)
    for _ in range(5):  # 5 x 200 steps on one runner: ordinals 1..6, evaluated at 5
        result = algo.train()
    before = list(algo.reward_window.items)
    assert [r for r, _ in before] == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert result[S.TRAIN_MEAN_REWARD] == pytest.approx(4.0)
    # Before training the probe's evaluation returned 1 (not a checkpoint's score); at
    # iteration 5 its evaluation envs' second episodes return 2.
    assert algo.best_eval == {"score": 2.0, "iteration": 5}
    path = algo.save_to_path(str(tmp_path / "ckpt"))
    algo.stop()

    restored = algorithm_class("ppo")(config=config)
    restored.restore_from_path(path)
    assert list(restored.reward_window.items) == before
    assert restored.best_eval == {"score": 2.0, "iteration": 5}
    result = restored.train()  # fresh envs: its first episode (200 steps) returns 1
    assert result[S.TRAIN_MEAN_REWARD] == pytest.approx(np.mean([3.0, 4.0, 5.0, 6.0, 1.0]))
    restored.stop()


def test_best_checkpoint_is_never_replaced_by_a_worse_one_after_a_resume(tmp_path):
    """The driver's Tune callback with a real run directory and real checkpoint folders. After
    --resume the algorithm's best is its restored checkpoint's, which can be older (lower) than
    the best the killed driver already kept: the kept one stays until a better one comes."""
    from types import SimpleNamespace

    from raylab.algorithms.algorithm import BEST_EVAL_KEY
    from raylab.config import compose, to_dict
    from raylab.reporting import RaylabTuneCallback

    run_dir = tmp_path / "run"
    run_dir.mkdir()  # raylab train claims it before Tune starts
    config = to_dict(compose("ppo", "Pendulum-v1", "mujoco", [f"training.log_dir={run_dir}"]))

    def ckpt(i: int):
        path = tmp_path / f"checkpoint_{i}"
        path.mkdir()
        (path / "weights").write_text(f"iteration {i}")
        return SimpleNamespace(path=str(path))

    def report(cb, trial, it: int, best):
        result = {
            "training_iteration": it,
            "time_total_s": float(it),
            "env_runners": {"num_env_steps_sampled_lifetime": 100 * it},
            BEST_EVAL_KEY: {"score": best[0], "iteration": best[1]},
        }
        trial.last_result = result
        cb.on_trial_result(0, [trial], trial, result)

    trial = SimpleNamespace(trial_id="t0", checkpoint=None, last_result={})
    first = RaylabTuneCallback(run_dir_for=lambda t: (run_dir, config))
    report(first, trial, 3, (10.0, 3))
    first.on_checkpoint(0, [trial], trial, ckpt(3))
    kept = run_dir / "checkpoints" / "best"
    assert read_summary(run_dir)["best_eval"]["score"] == 10.0
    assert (kept / "weights").read_text() == "iteration 3"

    resumed = RaylabTuneCallback(run_dir_for=lambda t: (run_dir, config))  # a new driver
    report(resumed, trial, 2, (5.0, 2))  # restored from an older checkpoint
    resumed.on_checkpoint(0, [trial], trial, ckpt(2))
    summary = read_summary(run_dir)["best_eval"]
    assert summary["score"] == 10.0 and summary["training_iteration"] == 3
    assert (kept / "weights").read_text() == "iteration 3"

    report(resumed, trial, 6, (12.0, 6))
    resumed.on_checkpoint(0, [trial], trial, ckpt(6))
    summary = read_summary(run_dir)["best_eval"]
    assert summary["score"] == 12.0 and summary["env_steps"] == 600
    assert summary["checkpoint"] == str(kept) and (kept / "weights").read_text() == "iteration 6"
    resumed.on_experiment_end([trial])
    first.on_experiment_end([trial])


def test_budget_stopper_stops_on_the_best_evaluation_reaching_its_target():
    """training.stop_eval_reward: a trial stops at the first result whose best evaluation (a
    trained policy's, BEST_EVAL_KEY) reaches the target; not before, not on the training
    return, not without the option."""
    from raylab.algorithms.algorithm import BEST_EVAL_KEY
    from raylab.config import compose
    from raylab.reporting import BudgetStopper, StopRequest

    StopRequest.requested.clear()
    cfg = compose("appo", "microduck_balance", overrides=["training.stop_eval_reward=350"])
    stop = BudgetStopper.of(cfg.training)
    base = {"num_env_steps_sampled_lifetime": 1000, "time_total_s": 10.0}
    assert not stop("t", base)
    assert not stop("t", {**base, S.TRAIN_MEAN_REWARD: 400.0})  # the training return: no
    assert not stop("t", {**base, BEST_EVAL_KEY: {"score": 349.9, "iteration": 50}})
    assert stop("t", {**base, BEST_EVAL_KEY: {"score": 350.0, "iteration": 100}})
    unset = BudgetStopper.of(compose("appo", "microduck_balance").training)
    assert not unset("t", {**base, BEST_EVAL_KEY: {"score": 1e9, "iteration": 100}})


def test_steps_per_second_of_a_drivers_first_result_counts_only_this_iterations_steps():
    """Steps/s of the first result a driver sees: the iteration's own count when RLlib gives it;
    otherwise the lifetime count in a new run, and no rate after a restore (the lifetime count
    then holds the restored steps: SAC printed 295,068 steps/s after a resume)."""
    from raylab.reporting import canonical_metrics

    def result(iteration, since_restore, lifetime, this_iter=None):
        runners = {"num_env_steps_sampled_lifetime": lifetime}
        if this_iter is not None:
            runners["num_env_steps_sampled"] = this_iter
        return {
            "env_runners": runners,
            "training_iteration": iteration,
            "iterations_since_restore": since_restore,
            "time_total_s": 2.0,
            "time_this_iter_s": 2.0,
        }

    fps = lambda r, prev=None: canonical_metrics(r, prev).get(S.PERF_TOTAL_FPS)  # noqa: E731
    assert fps(result(1, 1, 1_000)) == 500.0
    assert fps(result(1, 1, 1_000, this_iter=800)) == 400.0
    assert fps(result(148, 1, 300_000)) is None
    assert fps(result(148, 1, 300_000, this_iter=1_000)) == 500.0
    later = result(149, 2, 301_000)
    later["time_total_s"] = 4.0
    assert fps(later, result(148, 1, 300_000)) == 500.0
