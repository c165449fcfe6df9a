"""`raylab tune`: sweep files validate fail-closed, and a tiny 2-trial sweep runs end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO,
    assert_only_raylab_output,
    head_driver_env,
    run_cli,
    wait_for_tune_snapshot,
)

from raylab.errors import UserError
from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary
from raylab.sweep import load_spec

SHIPPED = sorted((REPO / "tune_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_sweeps_compose(path):
    spec = load_spec(str(path))
    assert spec.search and spec.metric in (S.TRAIN_MEAN_REWARD, S.EVAL_MEAN_REWARD)
    # every search key is a real config key of that algorithm and task
    cfg = spec.trial_config({k: None for k in []})
    assert cfg.algo.name == spec.algo and cfg.task == spec.task


def test_shipped_sweeps_cover_the_asked_combinations():
    combos = {(load_spec(str(p)).algo, load_spec(str(p)).task) for p in SHIPPED}
    assert ("appo", "microduck_balance") in combos
    assert ("sac", "microduck_balance") in combos


def _write(tmp_path, **data) -> Path:
    base = {"algo": "appo", "task": "Pendulum-v1", "search": {"algo.lr": {"choice": [1e-3]}}}
    base.update(data)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"search": {"algo.lrr": {"choice": [1]}}}, "did you mean 'algo.lr'"),
        ({"search": {"algo.lr": {"normal": [0, 1]}}}, "choice, uniform, loguniform"),
        ({"search": {"algo.lr": {"loguniform": [0, 1]}}}, "invalid"),
        ({"search": {"algo.lr": {"choice": ["fast"]}}}, "algo.lr"),
        ({"scheduler": {"type": "pbt"}}, "asha"),
        ({"scheduler": {"metric": "Perf/total_fps"}}, "Train/mean_reward"),
        ({"colour": "red"}, "unknown sweep key 'colour'"),
        ({"overrides": ["algo.nope=1"]}, "algo.nope"),
        (
            {"scheduler": {"metric": "Eval/mean_reward"}, "overrides": ["training.eval_every=0"]},
            "training.eval_every=0",
        ),
    ],
)
def test_bad_sweep_files_fail_with_one_line(tmp_path, data, needle):
    with pytest.raises(UserError, match=None) as e:
        load_spec(str(_write(tmp_path, **data)))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_asha_leaves_a_trial_past_iteration_100_to_its_budget(tmp_path):
    """Tune's ASHA stops every trial at its max_t, 100 iterations by default; a sweep's trial
    runs until its budget (steps, time) unless a rung cuts it."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from raylab.sweep import make_scheduler

    spec = load_spec(str(_write(tmp_path, scheduler={"grace_period": 5, "reduction_factor": 3})))
    scheduler = make_scheduler(spec)
    scheduler.set_search_properties(spec.metric, spec.mode)
    trial = SimpleNamespace(trial_id="t0")
    scheduler.on_trial_add(None, trial)
    for iteration in range(1, 400):
        action = scheduler.on_trial_result(
            None, trial, {"training_iteration": iteration, spec.metric: float(iteration)}
        )
        assert action == TrialScheduler.CONTINUE, iteration


def test_missing_sweep_file_is_one_line_exit_2(tmp_path):
    r = run_cli("tune", str(tmp_path / "none.yaml"), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_two_trial_sweep_end_to_end(tmp_path, idle_head):
    """Two trials ranked by their evaluations (Eval/mean_reward: each trial's best)."""
    path = _write(
        tmp_path,
        name="tiny",
        log_root=str(tmp_path / "sweeps"),
        overrides=[
            "env.num_envs=4",
            "algo.train_batch_size=256",
            "resources.dashboard=false",
            "training.checkpoint_every=2",
            "training.eval_every=2",
            "training.eval_episodes=2",
            "training.eval_before_train=false",
            "training.eval_background=false",  # trials of a few iterations: evaluations in line
        ],
        # a second, long key: the printed table must hold every column name in full
        # and a list-valued key (the summary holds it as a list)
        search={
            "algo.lr": {"grid": [3e-4, 1e-3]},
            "algo.entropy_coeff": {"choice": [0.0]},
            "algo.hidden": {"choice": [[32, 32]]},
        },
        scheduler={"type": "fifo", "metric": S.EVAL_MEAN_REWARD},
        num_samples=1,
        max_concurrent_trials=1,
        budget={"time_budget_s": 8},
    )
    r = run_cli("tune", str(path), env=head_driver_env(idle_head), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert_only_raylab_output(r.stdout + r.stderr)
    (sweep_dir,) = (tmp_path / "sweeps").glob("tiny_*")
    table = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert len(table["trials"]) == 2
    lrs = sorted(t["config"]["algo.lr"] for t in table["trials"])
    assert lrs == [3e-4, 1e-3]
    assert table["metric"] == S.EVAL_MEAN_REWARD
    assert table["best"]["metric"] == max(t["metric"] for t in table["trials"])
    for t in table["trials"]:
        run_dir = Path(t["run_dir"])
        summary = read_summary(run_dir / "run_summary.json")
        assert summary["status"] == "completed"
        assert t["metric"] == summary["best_eval"]["score"]
        assert t["checkpoint"] == summary["best_eval"]["checkpoint"]
        config = json.loads((run_dir / "run_config.json").read_text())
        assert config["algo"]["lr"] == t["config"]["algo.lr"]
        assert t["config"]["algo.hidden"] == config["algo"]["hidden"] == [32, 32]
        assert all(S.is_canonical(tag) for tag in extract(run_dir).tags)
    assert (sweep_dir / "sweep_summary.csv").read_text().count("\n") == 3
    # Progress on stderr: each trial's start with its sampled values, a line per evaluation.
    for t in table["trials"]:
        tid = t["trial_id"]
        assert f"raylab: trial {tid} started: " in r.stderr, r.stderr[-3000:]
        evals = [ln for ln in r.stderr.splitlines() if ln.startswith(f"raylab: trial {tid},")]
        assert any(S.EVAL_MEAN_REWARD in ln for ln in evals), r.stderr[-3000:]
    # The table printed into a pipe: full trial ids and column names, the best trial marked on
    # its own row (not cut to an 80-column terminal).
    header = next(line for line in r.stdout.splitlines() if "trial" in line and "status" in line)
    for name in ("trial", "best", "status", "env steps", S.EVAL_MEAN_REWARD, "algo.lr"):
        assert name in header, r.stdout
    assert "algo.entropy_coeff" in header, r.stdout
    lines = r.stdout.splitlines()
    rows = {t["trial_id"]: [ln for ln in lines if t["trial_id"] in ln] for t in table["trials"]}
    assert all(len(found) == 1 for found in rows.values()), r.stdout
    best = table["best"]["trial_id"]
    assert all(("*" in found[0]) == (tid == best) for tid, found in rows.items()), r.stdout


ASHA_STEPS = 8_000
SHORT_LONG = (50, 50, 100, 100, 100, 100)  # Pendulum episode lengths of the ASHA trials


@pytest.mark.slow
def test_asha_stops_trials_early_on_train_mean_reward(tmp_path, idle_head):
    """Six trials, two at a time; ASHA (reduction factor 4, rungs at iterations 1, 4 and 16)
    stops a trial whose Train/mean_reward at a rung is below the best quarter recorded there.
    The first two trials run Pendulum with 50-step episodes (returns about half of the
    100-step ones), the other four with 100: when each of those reaches a rung, the two short
    ones, which started first, have recorded it already, and ASHA must stop it there. (Six
    trials that differed only by seed depended on the order they reached the rungs: in one CI
    run none was stopped. With 200-step episodes a loaded machine's trial had no finished
    episode at rung 4, so no decision, and reached its budget before rung 16.) The budget is
    in env steps, not seconds, so that a trial reaches the rungs however loaded the machine
    is; short iterations (0.3 s, about 300-900 env steps) put
    rung 4 well inside it; Train/mean_reward is NaN until a trial's first episode ends, and a
    NaN is recorded without a decision."""
    path = _write(
        tmp_path,
        name="asha",
        log_root=str(tmp_path / "sweeps"),
        overrides=[
            "env.num_envs=4",
            "algo.train_batch_size=256",
            "algo.hidden=[32,32]",
            "resources.dashboard=false",
            "training.checkpoint_every=0",
            "training.eval_every=0",
            "training.eval_before_train=false",
            "training.iteration_s=0.3",
        ],
        search={"env.kwargs": {"grid": [{"max_episode_steps": n} for n in SHORT_LONG]}},
        scheduler={
            "type": "asha",
            "metric": "Train/mean_reward",
            "mode": "max",
            "grace_period": 1,
            "reduction_factor": 4,
        },
        num_samples=1,
        max_concurrent_trials=2,
        budget={"total_steps": ASHA_STEPS},
    )
    r = run_cli("tune", str(path), env=head_driver_env(idle_head), timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "sweeps").glob("asha_*")
    table = json.loads((sweep_dir / "sweep_summary.json").read_text())
    rows = table["trials"]
    assert len(rows) == 6
    assert [t["config"]["env.kwargs"]["max_episode_steps"] for t in rows] == list(SHORT_LONG)
    by = [t["stopped_by"] for t in rows]
    assert by[2:] == ["scheduler"] * 4 and "budget" in by[:2], rows
    for t in rows:
        if t["stopped_by"] == "scheduler":
            assert read_summary(Path(t["run_dir"]))["env_steps"] < ASHA_STEPS
    best = table["best"]
    assert best["stopped_by"] == "budget" or best["metric"] is not None
    assert best["checkpoint"] and Path(best["checkpoint"]).is_dir()
    assert f"raylab: best trial {best['trial_id']}" in r.stderr
    assert best["config"]["env.kwargs"] == {"max_episode_steps": 50}, best
    assert """'env.kwargs={"max_episode_steps":50}'""" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_tune_resume_after_the_driver_is_killed_finishes_the_unfinished_trials(tmp_path, idle_head):
    import os
    import signal
    import subprocess
    import time

    from conftest import RAYLAB

    path = _write(
        tmp_path,
        name="resume",
        log_root=str(tmp_path / "sweeps"),
        overrides=[
            "env.num_envs=4",
            "algo.train_batch_size=256",
            "algo.hidden=[32,32]",
            "resources.dashboard=false",
            "training.checkpoint_every=2",
            "training.eval_every=0",
            "training.eval_before_train=false",
        ],
        search={"algo.lr": {"grid": [3e-4, 1e-3, 3e-3]}},
        scheduler={"type": "fifo"},
        num_samples=1,
        max_concurrent_trials=1,
        budget={"time_budget_s": 8},
    )
    log = open(tmp_path / "driver.log", "w")
    env = head_driver_env(idle_head)
    proc = subprocess.Popen(
        [RAYLAB, "tune", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )

    def statuses():
        out = {}
        for d in (tmp_path / "sweeps").glob("resume_*/trials/*"):
            try:
                out[d.name] = read_summary(d)
            except Exception:
                pass
        return out

    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            s = statuses()
            done = [k for k, v in s.items() if v["status"] == "completed"]
            running = [
                k for k, v in s.items() if v["status"] == "running" and v.get("last_checkpoint")
            ]
            if done and running:
                break
            time.sleep(0.5)
        else:
            raise AssertionError((tmp_path / "driver.log").read_text()[-3000:])
        # Tune records its experiment state every 5 s: wait until it has the cut trial's
        # checkpoint.
        wait_for_tune_snapshot(tmp_path / "sweeps", after=time.time())
        before = statuses()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    (sweep_dir,) = (tmp_path / "sweeps").glob("resume_*")
    # Tune rotates checkpoints away (num_to_keep) between its experiment snapshots, so the
    # checkpoint a snapshot names can be gone when the driver dies. Make that certain for the
    # cut trials: keep only their newest checkpoint, under an index no snapshot has seen.
    newest = {}
    for trial_id, s in before.items():
        if s["status"] != "completed":
            trial_tune_dir = Path(s["last_checkpoint"]).parent
            states = [p / "algorithm_state.pkl" for p in trial_tune_dir.glob("checkpoint_*")]
            last = max((f for f in states if f.is_file()), key=os.path.getmtime).parent
            newest[trial_id] = trial_tune_dir / "checkpoint_000900"
            last.rename(newest[trial_id])
            for old in trial_tune_dir.glob("checkpoint_0*"):
                if old != newest[trial_id]:
                    shutil.rmtree(old)
    assert newest, before
    r = run_cli("tune", "--resume", str(sweep_dir), env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for trial_id, path in newest.items():
        assert f"raylab: restoring trial {trial_id} from checkpoint {path} (" in r.stderr, r.stderr
    table = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert len(table["trials"]) == 3
    assert all(t["status"] == "completed" for t in table["trials"]), table["trials"]
    after = statuses()
    for trial_id, s in before.items():
        if s["status"] == "completed":  # finished before the kill: not run again
            assert after[trial_id]["end_time"] == s["end_time"]
            assert after[trial_id]["env_steps"] == s["env_steps"]
        else:  # cut short by the kill: continued from its newest checkpoint, not from zero
            assert after[trial_id]["restored_from"][-1] == str(newest[trial_id]), after[trial_id]
            assert after[trial_id]["training_iteration"] > s["training_iteration"]
    assert table["best"] is not None
