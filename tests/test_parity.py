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
