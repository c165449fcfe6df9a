"""benchmarks/eval_share.py --compare: which iterations ran during an evaluation, and the
Steps/s of those against the others."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from raylab.metrics import schema as S
from raylab.metrics.extract import MetricTable

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("eval_share", ROOT / "benchmarks/eval_share.py")
eval_share = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_share)


def table() -> MetricTable:
    # One iteration a second from t = 1000 s; 1,000 Steps/s, but 500 on the iterations that end
    # at 1040-1044 s, when an evaluation of 5 s ran (reported at 1045 s, step 45,000); the
    # initial evaluation (step 0) ran before any iteration; the first 20 s are warm-up.
    steps = range(1, 61)
    fps = {1000 * k: (500.0 if 40 <= k <= 44 else 1000.0) for k in steps}
    fps[1000 * 5] = 10.0  # a slow warm-up iteration, left out
    return MetricTable(
        run_dir=Path("run"),
        schema_version=1,
        legacy_unversioned=False,
        values={
            S.PERF_TOTAL_FPS: fps,
            S.PERF_EVALUATION_MS: {0: 4000.0, 45000: 5000.0},
        },
        wall_time={0: 999.0, **{1000 * k: 1000.0 + k for k in steps}},
    )


def test_an_evaluation_window_ends_at_its_report_and_lasts_its_own_wall_time():
    assert eval_share.eval_windows(table()) == [(1040.0, 1045.0)]


def test_steps_per_second_during_evaluations_against_the_rest_after_warm_up():
    t = table()
    got = eval_share.fps_during(t, eval_share.eval_windows(t))
    # 1040-1045 s: the iterations ending at 1040..1044 (500) and 1045 (1,000).
    assert got["fps_during_eval"] == pytest.approx((5 * 500 + 1000) / 6, abs=0.1)
    assert got["fps_otherwise"] == pytest.approx(1000.0)  # from t >= 1019 s: no warm-up outlier
    assert got["fps_drop"] == pytest.approx(1 - ((5 * 500 + 1000) / 6) / 1000, abs=1e-3)
    assert eval_share.fps_during(t, [])["fps_drop"] is None  # no evaluation: nothing to compare


def test_the_in_run_cost_is_the_initial_evaluation_plus_the_drop_over_the_windows():
    t = table()
    got = eval_share.in_run_cost(t, wall_s=60.0)
    drop = 1 - ((5 * 500 + 1000) / 6) / 1000
    assert got["initial_eval_s"] == 4.0 and got["eval_window_s"] == 5.0
    assert got["lost_s"] == pytest.approx(4.0 + drop * 5.0, abs=0.01)
    assert got["in_run_cost"] == pytest.approx((4.0 + drop * 5.0) / 60.0, abs=1e-3)
