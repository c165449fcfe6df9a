"""Stats tracker: reduce types, denominators, scopes, named trackers, timing, exact merging.

Merging the exports of real Ray actors is tested in test_metrics_ray.py.
"""

from __future__ import annotations

import math
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
import torch

from raylab.metrics import schema, tracker
from raylab.metrics.tracker import ReduceType, StatsTracker, drop_counts, merge_exports


def final(t: StatsTracker) -> dict:
    return merge_exports([t.export()])


def test_stat_default_avg_min_max_with_mask():
    t = StatsTracker()
    t.denominator(valid=np.array([True, False, True, True]))
    t.stat(denominator="valid", adv=np.array([1.0, 100.0, 2.0, 6.0]))
    assert final(t) == {"adv/avg": 3.0, "adv/min": 1.0, "adv/max": 6.0, "valid": 3.0}


@pytest.mark.parametrize(
    "reduce_type, expected",
    [
        (ReduceType.AVG, {"x": 2.5}),
        (ReduceType.SUM, {"x": 10.0}),
        (ReduceType.MIN, {"x": 1.0}),
        (ReduceType.MAX, {"x": 4.0}),
        ("avg_min_max", {"x/avg": 2.5, "x/min": 1.0, "x/max": 4.0}),
    ],
)
def test_reduce_types(reduce_type, expected):
    t = StatsTracker()
    t.denominator(n=np.ones(4, dtype=bool))
    t.stat(denominator="n", reduce_type=reduce_type, x=np.array([3.0, 1.0, 4.0, 2.0]))
    out = final(t)
    del out["n"]
    assert out == expected


def test_scalar_mean_and_count_weighting():
    t = StatsTracker()
    t.scalar(lr=0.1)
    t.scalar(lr=0.3, clip=np.float32(0.5))
    t.scalar(clip=torch.tensor(1.5))
    out = final(t)
    assert out == {"lr": 0.2, "lr__count": 2.0, "clip": 1.0, "clip__count": 2.0}
    assert drop_counts(out) == {"lr": 0.2, "clip": 1.0}
    with pytest.raises(ValueError, match="use stat"):
        t.scalar(bad=np.zeros(3))


def test_torch_tensors_and_masks():
    t = StatsTracker()
    mask = torch.tensor([[True, False], [True, True]])
    t.denominator(tokens=mask)
    t.stat(denominator="tokens", q=torch.tensor([[1.0, 9.0], [2.0, 3.0]], dtype=torch.float32))
    assert final(t) == {"q/avg": 2.0, "q/min": 1.0, "q/max": 3.0, "tokens": 3.0}


def test_denominator_rules():
    t = StatsTracker()
    with pytest.raises(ValueError, match="boolean mask"):
        t.denominator(n=np.array([1, 0, 1]))
    with pytest.raises(KeyError, match="unknown denominator"):
        t.stat(denominator="missing", x=np.zeros(2))
    t.denominator(n=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="shape"):
        t.stat(denominator="n", x=np.zeros(2))
    with pytest.raises(ValueError, match="scalar"):
        t.stat(denominator="n", reduce_type=ReduceType.SCALAR, x=np.zeros(3))
    t.stat(denominator="n", reduce_type=ReduceType.AVG, x=np.zeros(3))
    with pytest.raises(ValueError, match="recorded as avg"):
        t.stat(denominator="n", reduce_type=ReduceType.SUM, x=np.zeros(3))


def test_empty_denominator_omits_the_key_never_nan():
    t = StatsTracker()
    t.denominator(valid=np.zeros(5, dtype=bool))
    for rt in ReduceType:
        if rt is ReduceType.SCALAR:
            continue
        t.stat(denominator="valid", reduce_type=rt, **{f"x_{rt.value}": np.arange(5.0)})
    out = final(t)
    assert out == {"valid": 0.0}
    assert not any(math.isnan(v) for v in out.values())


def test_scopes_nest_and_named_trackers_prefix():
    t = StatsTracker("rollout")
    with t.scope("sac"):
        t.scalar(a=1.0)
        with t.scope("update"):
            t.denominator(n=np.array([True]))
            t.stat(denominator="n", reduce_type="avg", q=np.array([2.0]))
    t.scalar(b=3.0)
    assert set(final(t)) == {
        "rollout/sac/a",
        "rollout/sac/a__count",
        "rollout/sac/update/n",
        "rollout/sac/update/q",
        "rollout/b",
        "rollout/b__count",
    }


def test_module_level_named_trackers_are_separate():
    tracker.get("eval-test").reset()
    tracker.get("").reset()
    tracker.scalar(reward=1.0)
    tracker.get("eval-test").scalar(reward=5.0)
    assert tracker.get("eval-test") is tracker.get("eval-test")
    out = merge_exports([tracker.export_all()])
    assert out["reward"] == 1.0 and out["eval-test/reward"] == 5.0
    assert tracker.export_all() == {}  # reset by the previous export


def test_record_timing_units_scopes_and_canonical_tags():
    t = StatsTracker("learner")
    with t.scope("phase"):
        with t.record_timing("sample"):
            time.sleep(0.02)
    with t.record_timing(schema.PERF_LEARNER_REPLAY_SAMPLE_MS, under=None):
        time.sleep(0.02)
    out = final(t)
    assert 0.015 < out["learner/phase/timeperf/sample"] < 1.0  # seconds
    assert 15.0 < out["learner/Perf/learner_replay_sample_ms"] < 1000.0  # milliseconds
    g = StatsTracker()
    with g.record_timing(schema.PERF_LEARNER_COLLECTOR_WAIT_MS, under=None):
        pass
    assert schema.PERF_LEARNER_COLLECTOR_WAIT_MS in final(g)


def test_export_reset_and_keep():
    t = StatsTracker()
    t.scalar(a=1.0)
    assert t.export(reset=False) == t.export(reset=True)
    assert t.export() == {}


def test_thread_safety_and_per_thread_scopes():
    t = StatsTracker()
    n_threads, n_calls = 4, 500

    def work(i):
        with t.scope(f"w{i}"):
            for _ in range(n_calls):
                t.scalar(x=1.0)
                t.scalar(total=float(i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = final(t)
    for i in range(n_threads):
        assert out[f"w{i}/x__count"] == n_calls
        assert out[f"w{i}/total"] == float(i)


def test_merge_is_exact_and_order_independent():
    rng = np.random.default_rng(0)
    data = rng.normal(size=3000) * 10.0 ** rng.integers(-8, 8, size=3000)
    mask = rng.random(3000) < 0.7
    one = StatsTracker()
    one.denominator(m=mask)
    one.stat(denominator="m", x=data)
    for v in data[:50]:
        one.scalar(s=v)
    expected = final(one)
    exact_mean = sum(map(Fraction, data[mask].tolist())) / int(mask.sum())
    assert expected["x/avg"] == float(exact_mean)

    parts = []
    for lo, hi in ((0, 7), (7, 1900), (1900, 3000)):
        t = StatsTracker()
        t.denominator(m=mask[lo:hi])
        t.stat(denominator="m", x=data[lo:hi])
        for v in data[lo : min(hi, 50)]:
            t.scalar(s=v)
        parts.append(t.export())
    assert merge_exports(parts) == expected
    assert merge_exports(parts[::-1]) == expected


def test_merge_with_keys_missing_on_some_workers_and_nonfinite():
    a, b = StatsTracker(), StatsTracker()
    a.scalar(only_a=2.0, both=1.0)
    b.scalar(both=3.0)
    b.denominator(n=np.array([True, True]))
    b.stat(denominator="n", loss=np.array([1.0, np.inf]))
    a.denominator(n=np.array([True]))
    a.stat(denominator="n", loss=np.array([np.nan]))
    out = merge_exports([a.export(), b.export()])
    assert out["only_a"] == 2.0 and out["only_a__count"] == 1.0
    assert out["both"] == 2.0
    assert math.isnan(out["loss/avg"]) and math.isnan(out["loss/min"])
    assert merge_exports([]) == {}


def test_merge_rejects_conflicting_reduce_types():
    a, b = StatsTracker(), StatsTracker()
    a.scalar(x=1.0)
    b.denominator(n=np.array([True]))
    b.stat(denominator="n", reduce_type="sum", x=np.array([1.0]))
    with pytest.raises(ValueError, match="one reduce type"):
        merge_exports([a.export(), b.export()])


def test_exports_survive_json_and_expose_no_huge_numbers():
    """Exports travel through RLlib / Tune results: JSON round trip, every number float()-able."""
    import json

    t = StatsTracker()
    t.denominator(n=np.array([True, True, False]))
    t.stat(denominator="n", x=np.array([1e300, -2.5, 7.0]))
    t.scalar(lr=3e-4)
    exported = t.export(reset=False)
    for state in exported.values():
        for value in state.values():
            if isinstance(value, (int, float)):
                float(value)  # would raise OverflowError for a raw exact-sum integer
    round_tripped = json.loads(json.dumps(exported))
    assert merge_exports([round_tripped]) == merge_exports([exported]) == final(t)
