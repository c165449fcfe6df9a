"""benchmarks/parity/run.py: the two definitions of a training return it compares with the
reference implementations' figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("parity_run", ROOT / "benchmarks/parity/run.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

# 1,000-step episodes ending every 1,000 env steps, returns rising by 10 per episode.
EPISODES = [[1000 * (k + 1), 10.0 * k] for k in range(300)]


def test_window_averages_the_episodes_within_5000_steps_either_side():
    # Episodes ending at 95k..105k: returns 940..1040.
    assert parity.window(EPISODES, 100_000) == pytest.approx(990.0)
    # At the end of the run the window is one-sided: 295k..300k.
    assert parity.window(EPISODES, 300_000) == pytest.approx(2965.0)
    assert parity.window(EPISODES, -6_000) is None  # no episode within reach


def test_last100_is_the_mean_of_the_latest_100_episodes():
    # At 100k the latest 100 episodes are the whole run: returns 0..990.
    assert parity.last100(EPISODES, 100_000) == pytest.approx(495.0)
    assert parity.last100(EPISODES, 250_000) == pytest.approx(1995.0)
    assert parity.last100(EPISODES, 500) is None


def test_value_at_refuses_a_step_the_run_did_not_reach():
    result = {"episodes": EPISODES, "env_steps": 300_000}
    assert parity.value_at(result, 300_000, parity.last100) == pytest.approx(2495.0)
    assert parity.value_at(result, 310_000, parity.last100) is None


def test_runs_that_differ_only_in_speed_settings_are_seeds_of_one_configuration():
    a = ["algo.lr=5e-5", "algo.learner_threads=1"]
    b = ["algo.lr=5e-5"]
    assert parity.learning_overrides(a) == parity.learning_overrides(b) == ("algo.lr=5e-5",)
    assert parity.learning_overrides(["algo.lr=1e-4"]) != parity.learning_overrides(b)


@pytest.mark.slow
def test_a_run_stopped_after_its_minutes_resumes_to_its_budget_with_its_replay(
    tmp_path, monkeypatch, capsys
):
    """--stop-after-min stops a real SAC run gracefully (SIGTERM, its final checkpoint) short
    of its budget; --resume continues it to the budget with the replay it had
    (algo.store_buffer_in_checkpoints): no second random warm-up, the episodes go on from the
    stopped run's, and the result adds up both segments. `raylab train` runs with its own
    local Ray here, as the runner starts it for a user."""
    monkeypatch.setattr(parity, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(parity, "RESULTS", tmp_path / "results")
    overrides = [
        "algo.store_buffer_in_checkpoints=true",
        "algo.updates_per_step=0.25",
        "algo.hidden=[32,32]",
        "algo.learning_starts=1000",
        "env.num_envs=4",
    ]
    steps = 30000
    # The stop time (3 s) comes before Ray and the run are up: the runner waits for the first
    # iteration and stops right after it (a stop before it would leave nothing to resume).
    first = parity.train_one("sac", "Pendulum-v1", 0, steps, "_t", overrides, stop_after_min=0.05)
    assert "no iteration yet; waiting for the first before stopping" in capsys.readouterr().out
    assert first["status"] == "interrupted", first["status"]
    assert 0 < first["env_steps"] < steps // 2
    log = (tmp_path / "runs" / "sac_Pendulum-v1_s0_t.log").read_text()
    second = parity.train_one("sac", "Pendulum-v1", 0, steps, "_t", [], resume=True)
    assert second["status"] == "completed" and second["env_steps"] >= steps
    assert second["overrides"] == overrides  # the stopped run's
    assert [s["status"] for s in second["segments"]] == ["interrupted", "completed"]
    assert second["wall_s"] == pytest.approx(sum(s["wall_s"] for s in second["segments"]), abs=0.2)
    ends = [e[0] for e in second["episodes"]]
    # The last batch of episodes ends within one episode of each env (4 x 200 env steps) of
    # the end: where in that span depends on where the stop fell.
    assert ends == sorted(ends) and ends[-1] >= steps - 4 * 200
    # 200-step episodes, before and after the stop (the 4 envs' episodes in flight at the stop
    # and at the end are not finished)
    assert len(second["episodes"]) >= steps // 200 - 8
    assert (tmp_path / "runs" / "sac_Pendulum-v1_s0_t.log").read_text().startswith(log)
