"""Term-table managers (raylab.envs.core.managers) on small hand-made envs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from raylab.envs.core.managers import (
    CommandManager,
    CommandTerm,
    EventManager,
    EventTerm,
    ObservationManager,
    ObsTerm,
    RewardManager,
    RewardTerm,
    TerminationManager,
    TerminationTerm,
    reward_tag,
    termination_tag,
)
from raylab.envs.tasks.microduck_balance import OBS_SCALE, OBSERVATIONS


def test_tag_helpers():
    assert reward_tag("upright") == "reward/upright"
    assert termination_tag("time_out") == "Episode_Termination/time_out"


def test_observation_scale_table_is_float32_and_matches_the_reference():
    m = ObservationManager(OBSERVATIONS, num_envs=2)
    assert m.scale.dtype == np.float32 and m.dim == 48
    assert np.array_equal(m.scale, OBS_SCALE)
    env = SimpleNamespace(v=np.array([[1.0, 2.0], [3.0, 4.0]]))
    om = ObservationManager([ObsTerm("v", lambda e: e.v, 2, scale=0.05)], num_envs=2)
    out = om.compute(env)
    assert out.dtype == np.float32
    assert np.array_equal(out, (env.v * np.float32(0.05)).astype(np.float32))


def test_reward_manager_sums_in_table_order_and_logs_active_envs_only():
    env = SimpleNamespace(a=np.array([1.0, 2.0, 3.0]), b=np.array([10.0, 20.0, 30.0]))
    rm = RewardManager(
        [RewardTerm("a", lambda e: e.a, 2.0), RewardTerm("b", lambda e: e.b, -0.5)], 3
    )
    active = np.array([True, True, False])
    total = rm.compute(env, active)
    np.testing.assert_array_equal(total, [2.0 - 5.0, 4.0 - 10.0, 0.0])
    assert rm.step_log(active) == {"reward/a": 3.0, "reward/b": -7.5}
    rm.compute(env, np.array([False, False, True]))
    log = rm.pop_log()
    assert log == {
        "reward/a": pytest.approx((2 + 4 + 6) / 3),
        "reward/b": pytest.approx(-(5 + 10 + 15) / 3),
    }
    assert rm.pop_log() == {}  # nothing since the last pop


def test_termination_manager_splits_time_outs_and_counts_per_term():
    env = SimpleNamespace(t=np.array([5, 1, 5, 5]), fell=np.array([False, True, True, False]))
    tm = TerminationManager(
        [
            TerminationTerm("time_out", lambda e: e.t >= 5, time_out=True),
            TerminationTerm("fallen", lambda e: e.fell),
        ],
        4,
    )
    term, trunc = tm.compute(env, np.array([True, True, True, False]))
    np.testing.assert_array_equal(term, [False, True, True, False])
    np.testing.assert_array_equal(trunc, [True, False, True, False])
    assert tm.step_log() == {"Episode_Termination/time_out": 2, "Episode_Termination/fallen": 2}
    tm.compute(env, np.ones(4, dtype=bool))
    assert tm.pop_log() == {"Episode_Termination/time_out": 5, "Episode_Termination/fallen": 4}
    assert tm.pop_log() == {"Episode_Termination/time_out": 0, "Episode_Termination/fallen": 0}


def test_command_manager_draws_in_range_resamples_and_is_per_env_reproducible():
    term = CommandTerm("velocity", ((-0.4, 0.4), (-0.3, 0.3), (-1.0, 1.0)), resample_steps=(3, 5))
    cm = CommandManager([term], num_envs=3)
    rngs = [np.random.default_rng(10 + i) for i in range(3)]
    cm.reset(np.arange(3), rngs)
    first = cm.get("velocity").copy()
    assert np.all(np.abs(first) <= [0.4, 0.3, 1.0])
    changed = np.zeros(3, dtype=bool)
    for _ in range(5):
        cm.step(np.ones(3, dtype=bool), rngs)
        changed |= np.any(cm.get("velocity") != first, axis=1)
    assert changed.all()  # every env was redrawn within 5 steps
    # env 1 alone, with the same seed, gets the same commands as env 1 of the batch
    solo = CommandManager([term], num_envs=1)
    r = [np.random.default_rng(11)]
    solo.reset([0], r)
    assert np.array_equal(solo.get("velocity")[0], first[1])


def test_command_zero_probability_gives_standing_commands():
    cm = CommandManager([CommandTerm("v", ((0.5, 1.0),), zero_prob=1.0)], num_envs=2)
    cm.reset([0, 1], [np.random.default_rng(0), np.random.default_rng(1)])
    assert np.all(cm.command == 0.0)


def test_event_manager_runs_terms_by_mode_and_refuses_unknown_modes():
    calls = []
    em = EventManager(
        [
            EventTerm("a", lambda e, ids: calls.append(("a", ids)), "reset"),
            EventTerm("b", lambda e, ids: calls.append(("b", ids)), "step"),
        ]
    )
    em.apply("reset", None, [1])
    em.apply("step", None)
    assert calls == [("a", [1]), ("b", None)]
    with pytest.raises(ValueError, match="unknown mode 'interval'; valid choices: reset, step"):
        EventManager([EventTerm("x", lambda e, ids: None, "interval")])


def test_duplicate_term_names_are_refused():
    with pytest.raises(ValueError, match="duplicate reward term name"):
        RewardManager([RewardTerm("a", lambda e: 0, 1.0)] * 2, 1)
