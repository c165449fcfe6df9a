"""An env that raises stops the run after a bounded number of restarts, with its own error.

The envs are tests/fixtures/faulty_env.py, imported by their ``module:id`` task name in the
driver and (through PYTHONPATH, which the session's head also carries) in the EnvRunner
processes: one raises on every step after its 200th, one in its constructor. Each run is a real
``raylab train`` joining the session's Ray head (conftest.py);
without raylab.algorithms.env_errors it runs its whole budget with EnvRunners restarting (the
first) or fails with RLlib's unrelated ``IndexError`` (the second). A killed EnvRunner (no
exception, just a dead process) is still restarted: tests/test_fault_tolerance.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import head_driver_env
from heads import RAYLAB

from raylab.algorithms.env_errors import MAX_SAME_ENV_ERRORS, error_line
from raylab.metrics.rundir import read_summary

FIXTURES = Path(__file__).parent / "fixtures"
STEP_ERROR = "ValueError: faulty env: joint 3 reads NaN"
BUILD_ERROR = "RuntimeError: faulty env: no robot on /dev/ttyUSB0"
BUDGET_S = 150


@pytest.fixture
def head(idle_head):
    return idle_head


def _train(algo: str, task: str, tmp_path: Path, head):
    env = head_driver_env(head)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FIXTURES), env.get("PYTHONPATH")]))
    t0 = time.monotonic()
    r = subprocess.run(
        [
            RAYLAB,
            "train",
            "--algo",
            algo,
            "--task",
            f"faulty_env:{task}",
            "env.num_envs=2",
            f"training.time_budget_s={BUDGET_S}",
            "training.terminal=plain",
            "resources.dashboard=false",
            "training.eval_every=0",
            "training.eval_before_train=false",
            f"training.log_root={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUDGET_S + 240,
    )
    return r, time.monotonic() - t0


def _failure_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("raylab: training failed:")]
    assert len(lines) == 1, stderr[-4000:]
    return lines[0]


def test_error_line_is_the_innermost_cause_on_one_line():
    try:
        try:
            raise ValueError("joint 3 reads NaN\nmore detail")
        except ValueError as e:
            raise RuntimeError from e  # what RLlib's EnvRunner does with an env's step error
    except RuntimeError as e:
        assert error_line(e) == "ValueError: joint 3 reads NaN"


# PPO and SAC: both EnvRunner classes (raylab's rollout loop, which APPO shares, and SAC's)
# and both ways of collecting (PPO waits for its samples, SAC fetches them asynchronously, as
# APPO does). APPO's run with an env that raises on every step after a while is the soak's
# failing physics worker (tests/test_soak.py), which stops with the env's error as well.
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_an_env_that_raises_on_step_stops_the_run_with_its_error(algo, tmp_path, head):
    r, wall = _train(algo, "raylab_test/FailsOnStep-v0", tmp_path, head)
    assert r.returncode == 1, r.stderr[-4000:]
    line = _failure_line(r.stderr)
    assert f"EnvError: the env raised {MAX_SAME_ENV_ERRORS} times" in line, line
    assert line.endswith(STEP_ERROR), line
    assert wall < BUDGET_S, f"ran {wall:.0f} s: the budget, not the error, ended it"
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "raylab: run failed;" in r.stderr
    assert read_summary(run)["status"] == "failed"


@pytest.mark.slow
def test_an_env_that_cannot_be_built_stops_the_run_at_once(tmp_path, head):
    r, wall = _train("ppo", "raylab_test/FailsOnConstruct-v0", tmp_path, head)
    assert r.returncode == 1, r.stderr[-4000:]
    line = _failure_line(r.stderr)
    expected = f"EnvError: the env cannot be built in EnvRunner 1: {BUILD_ERROR}"
    assert line == f"raylab: training failed: {expected}"
    assert wall < 90, wall
    assert "raylab: run failed;" in r.stderr
