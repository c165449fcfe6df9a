"""benchmarks/push_oracle.py: the planner's rollouts run the env's own physics, so what it
predicts for the first step of the plan it picks is what the env then does (it reads the env's
state and model; a planner on other physics would be no ceiling for the task)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import raylab.envs  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("push_oracle", ROOT / "benchmarks/push_oracle.py")
push_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(push_oracle)


def test_the_planner_predicts_the_envs_next_step_and_reacts_to_a_push():
    env = gym.make("raylab/MicroduckBalance-v0").unwrapped
    env.reset(seed=1003)
    args = SimpleNamespace(
        samples=32, horizon=20, knots=4, sigma=0.3, fall_penalty=5.0, threads=2, episodes=1
    )
    oracle = push_oracle.Oracle(env, args, np.random.default_rng(0))
    first_push = int(np.min(env.params.push_steps))
    moved = []
    for t in range(first_push + 3):
        action = oracle(None)[0]
        assert action.shape == (14,) and np.all(np.abs(action) <= 1.0)
        _, _, _, _, info = env.step(action)
        if t != first_push:  # the planner does not know the push that lands on this step
            assert info["trunk_height"] == pytest.approx(oracle.predicted["trunk_height"], abs=1e-9)
            assert info["upright_cos"] == pytest.approx(oracle.predicted["upright_cos"], abs=1e-9)
        else:
            assert info["pushed"]
        moved.append(float(np.abs(action).max()))
    # After the push lands (on step first_push) the planner's actions grow: it sees the push.
    assert max(moved[first_push + 1 :]) > max(moved[: first_push - 5])
