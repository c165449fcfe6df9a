"""benchmarks/learning_run.py refuses a run whose learning-rate schedule would never move: the
runner sets ``training.total_steps`` out of reach (the budget ends the run), so a configuration
that anneals the learning rate over it must name the steps it spans."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("learning_run", ROOT / "benchmarks/learning_run.py")
learning_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning_run)


def test_a_scheduled_task_without_total_steps_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        learning_run.main(
            [
                "no_such_run_xyz",
                "--algo",
                "ppo",
                "--task",
                "Pendulum-v1",
                "--budget-min",
                "1",
                "--post-only",
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "training.total_steps=N" in err and "Pendulum-v1" in err


def test_with_total_steps_or_without_a_schedule_it_goes_on_to_the_run(capsys, tmp_path):
    # --post-only on a run that does not exist stops right after the check: the check passed.
    for argv in (
        ["--algo", "ppo", "--task", "Pendulum-v1", "--", "training.total_steps=5000000"],
        ["--algo", "ppo", "--task", "go2_joystick_flat"],  # its std schedule ends with the budget
        ["--algo", "appo", "--task", "microduck_balance"],
    ):
        name, rest = "no_such_run_xyz", argv
        extra = rest[rest.index("--") :] if "--" in rest else []
        head = rest[: rest.index("--")] if "--" in rest else rest
        with pytest.raises(SystemExit):
            learning_run.main([name, *head, "--budget-min", "1", "--post-only", *extra])
        assert "--post-only: no run" in capsys.readouterr().err


def test_a_bad_override_is_one_line_not_a_traceback(capsys):
    # --post-only: should the check let it through, the run does not exist and nothing trains
    with pytest.raises(SystemExit) as e:
        learning_run.main(
            [
                "no_such_run_xyz",
                "--algo",
                "appo",
                "--task",
                "microduck_balance",
                "--budget-min",
                "1",
                "--post-only",
                "--",
                "algo.bogus=1",
            ]
        )
    assert e.value.code == 2
    assert "unknown config key 'algo.bogus'" in capsys.readouterr().err
