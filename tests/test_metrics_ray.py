"""Metrics with real Ray actors: tracker exports merged across workers, live manifest data,
backends refused outside the driver. One Ray instance for the module."""

from __future__ import annotations

import numpy as np
import pytest
import ray
from conftest import IN_PROCESS_CPUS

from raylab.metrics import tracker
from raylab.metrics.manifest import actor_placement, build_manifest, collect_cluster_info
from raylab.metrics.tracker import StatsTracker, merge_exports


@pytest.fixture
def ray_local(ray_in_process):
    return ray_in_process  # the test process's Ray (conftest.py)


@ray.remote(num_cpus=0)
class Worker:
    """Records part of the data with the module-level trackers of its own process."""

    def record(self, values, mask, scalars, extra_key):
        for v in scalars:
            tracker.scalar(reward=v)
        with tracker.scope("learner"):
            tracker.denominator(valid=np.asarray(mask, dtype=bool))
            tracker.stat(denominator="valid", adv=np.asarray(values))
            tracker.stat(denominator="valid", reduce_type="sum", rows=np.ones(len(values)))
        if extra_key:
            tracker.get("rollout").scalar(**{extra_key: 1.0})
        return tracker.export_all()

    def placement(self, index):
        return actor_placement(index, "cpu", num_envs=8, num_threads=2)

    def try_backend(self, path):
        from raylab.metrics.backends import TensorBoardBackend

        try:
            TensorBoardBackend(path)
        except RuntimeError as e:
            return str(e)
        return "created"


def _feed(t: StatsTracker, values, mask, scalars):
    for v in scalars:
        t.scalar(reward=v)
    with t.scope("learner"):
        t.denominator(valid=np.asarray(mask, dtype=bool))
        t.stat(denominator="valid", adv=np.asarray(values))
        t.stat(denominator="valid", reduce_type="sum", rows=np.ones(len(values)))


def test_exports_from_ray_actors_merge_to_the_single_tracker_numbers(ray_local):
    rng = np.random.default_rng(1)
    chunks = []
    for n in (50, 1, 0, 200):
        values = (rng.normal(size=n) * 1e3).tolist()
        mask = (rng.random(n) < 0.6).tolist()
        scalars = rng.normal(size=3).tolist() if n else []
        chunks.append((values, mask, scalars))
    chunks[1] = (chunks[1][0], [False], chunks[1][2])  # an all-False mask on one worker

    workers = [Worker.remote() for _ in chunks]
    extra = ["only_here", None, None, None]  # a key that exists on one worker only
    exports = ray.get([w.record.remote(*c, e) for w, c, e in zip(workers, chunks, extra)])

    single = StatsTracker()
    for values, mask, scalars in chunks:
        _feed(single, values, mask, scalars)
    expected = merge_exports([single.export()])
    expected.update({"rollout/only_here": 1.0, "rollout/only_here__count": 1.0})

    merged = merge_exports(exports)
    assert merged == expected  # bit-identical floats, same key set
    assert merge_exports(exports[::-1]) == expected


def test_empty_denominators_on_every_worker_omit_the_key(ray_local):
    workers = [Worker.remote() for _ in range(2)]
    exports = ray.get([w.record.remote([1.0, 2.0], [False, False], [], None) for w in workers])
    merged = merge_exports(exports)
    assert merged == {"learner/valid": 0.0}  # only the denominator count; no 0/0, no NaN


def test_manifest_from_a_live_cluster_and_actor_placement(ray_local):
    info = collect_cluster_info()
    assert info["ray_version"] == ray.__version__
    assert info["cluster_resources"]["CPU"] == IN_PROCESS_CPUS
    workers = [Worker.remote() for _ in range(2)]
    runners = ray.get([w.placement.remote(i) for i, w in enumerate(workers)])
    node_ids = {n["node_id"] for n in info["nodes"]}
    assert all(r["node_id"] in node_ids for r in runners)
    assert len({r["pid"] for r in runners}) == 2
    m = build_manifest(
        cluster_resources=info["cluster_resources"],
        nodes=info["nodes"],
        env_runners=runners,
        learners=[{"index": 0, "node_id": info["nodes"][0]["node_id"], "device": "cpu"}],
        envs_per_runner=8,
        threads_per_runner=2,
        sim_backend="mujoco",
        ray_version=info["ray_version"],
    )
    assert m["env_runners"][1]["index"] == 1 and m["env_runners"][0]["num_envs"] == 8


def test_backends_are_created_only_in_the_driver(ray_local, tmp_path):
    message = ray.get(Worker.remote().try_backend.remote(str(tmp_path)))
    assert "only in the driver" in message
    assert not list(tmp_path.iterdir())
