"""Runtime manifest v1: built from plain data, validated fail closed, embedded in the summary.

Collection from a live Ray cluster is tested in test_metrics_ray.py.
"""

from __future__ import annotations

import copy

import pytest

from raylab.metrics import manifest
from raylab.metrics.manifest import build_manifest, validate_manifest
from raylab.metrics.rundir import RunDirectory, read_summary
from raylab.metrics.schema import MetricSchemaError

NODE = {
    "node_id": "n1",
    "node_ip": "10.0.0.1",
    "hostname": "box",
    "alive": True,
    "resources": {"CPU": 16.0, "GPU": 1.0},
}


def plain_manifest(**over):
    kw = dict(
        cluster_resources={"CPU": 16.0, "GPU": 1.0},
        nodes=[NODE],
        env_runners=[
            {
                "index": i,
                "node_id": "n1",
                "device": "cpu",
                "num_envs": 64,
                "num_threads": 4,
                "pid": 100 + i,
            }
            for i in range(2)
        ],
        learners=[
            {
                "index": 0,
                "node_id": "n1",
                "device": "cuda:0",
                "accelerator_ids": ["0"],
                "kind": "learner",
            }
        ],
        envs_per_runner=64,
        threads_per_runner=4,
        sim_backend="mujoco",
        counters={"env_runner_restarts": 0, "env_steps_sampled": 12345},
        collector_metric_interval_s=1.0,
        ring={"kind": "sac_device_replay", "unit": "transitions", "capacity": 1000},
        inference_flight={"in_flight": 1, "max_in_flight": 2, "limit": 2},
        replay_ingress={
            "ingested": 500,
            "occupancy": 0.5,
            "high_water_occupancy": 0.5,
            "ingest_ms_mean": 1.5,
        },
        ray_version="2.60.0",
    )
    kw.update(over)
    return build_manifest(**kw)


def test_build_manifest_from_plain_data():
    m = plain_manifest()
    assert m["schema_version"] == manifest.RUNTIME_MANIFEST_SCHEMA_VERSION == 1
    assert m["sim_backend_device"] is None  # CPU MuJoCo: no accelerator binding
    assert m["learners"][0]["device"] == "cuda:0"
    assert [r["index"] for r in m["env_runners"]] == [0, 1]
    assert m["raylab_version"]
    assert set(manifest.REQUIRED_FIELDS) <= set(m)
    validate_manifest(m)


def test_stable_and_experimental_fields_are_declared():
    stable = {k for k, v in manifest.MANIFEST_FIELDS.items() if v[0] == "stable"}
    assert {
        "schema_version",
        "ray_version",
        "cluster_resources",
        "nodes",
        "env_runners",
        "learners",
        "envs_per_runner",
        "threads_per_runner",
        "sim_backend",
        "sim_backend_device",
        "counters",
        "collector_metric_interval_s",
        "collector_backend_device",
        "ring",
        "inference_flight",
        "replay_ingress",
    } <= stable
    for key in ("shutdown", "backend_diagnostics"):
        assert manifest.MANIFEST_FIELDS[key][0] == "experimental"
    assert manifest.MANIFEST_FIELDS["experimental"][0] == "experimental"
    m = plain_manifest(experimental={"anything": [1, 2]}, shutdown={"classification": "normal"})
    validate_manifest(m)


def _broken(path, value):
    m = copy.deepcopy(plain_manifest())
    node = m
    *parents, leaf = path
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return m


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["schema_version"], KeyError, "missing schema_version"),
        (["schema_version"], 2, "unsupported schema_version 2; supported: 1"),
        (["schema_version"], "1", "unsupported schema_version"),
        (["sim_backend_device"], KeyError, "missing required field 'sim_backend_device'"),
        (["sim_backend_device"], 3, "sim_backend_device must be a device string or null"),
        (["learners"], KeyError, "missing required field 'learners'"),
        (["surprise"], 1, "unknown field 'surprise'"),
        (["envs_per_runner"], 0, "envs_per_runner must be a positive int"),
        (["counters", "env_runner_restarts"], -1, "non-negative finite number"),
        (["counters", "x"], float("nan"), "non-negative finite number"),
        (["nodes"], [], "nodes must be a non-empty list"),
        (["env_runners", 0, "node_id"], "elsewhere", "is not one of the manifest's nodes"),
        (["env_runners", 1, "index"], 0, "duplicate indices"),
        (["env_runners", 0, "num_envs"], KeyError, "missing 'num_envs'"),
        (["learners", 0, "device"], "", "device must not be empty"),
        (["learners", 0, "gpu"], 1, "unknown field 'gpu'"),
        (["experimental"], [1], "experimental must be an object"),
        (["learners", 0, "kind"], "env_runner", "kind 'env_runner' in the learner list"),
        (["collector_backend_device"], "", "collector_backend_device must be a device string"),
        (["collector_metric_interval_s"], -1, "collector_metric_interval_s = -1"),
        (["ring", "capacity"], 0, "ring.capacity must be at least 1"),
        (["ring", "extra"], 1, "ring must be null or an object with exactly"),
        (["inference_flight", "max_in_flight"], -1, "non-negative finite number"),
        (["inference_flight", "limit"], 1.5, "inference_flight.limit has a bad type"),
        (["replay_ingress", "occupancy"], 0.9, "occupancy <= high_water_occupancy <= 1"),
        (["replay_ingress", "high_water_occupancy"], 1.5, "high_water_occupancy <= 1"),
        (["replay_ingress", "ingested"], KeyError, "replay_ingress must be null or an object"),
    ],
)
def test_validate_manifest_fails_closed(path, value, message):
    with pytest.raises(MetricSchemaError, match=message):
        validate_manifest(_broken(path, value))


def test_manifest_round_trips_through_run_summary(tmp_path):
    rd = RunDirectory(tmp_path)
    m = plain_manifest(sim_backend_device="cuda:0")
    rd.write_summary(runtime_manifest=m)
    assert read_summary(tmp_path)["runtime_manifest"] == m
    with pytest.raises(MetricSchemaError, match="runtime_manifest"):
        rd.update_summary(runtime_manifest=_broken(["schema_version"], 7))
    assert read_summary(tmp_path)["runtime_manifest"] == m  # the bad update wrote nothing


def test_a_completed_manifest_needs_collector_backend_device(tmp_path):
    m = plain_manifest()
    validate_manifest(m, completed=True)  # present (null: CPU MuJoCo)
    del m["collector_backend_device"]
    validate_manifest(m)  # a run still starting may not have it yet
    with pytest.raises(MetricSchemaError, match="completed manifest needs collector_backend"):
        validate_manifest(m, completed=True)
    rd = RunDirectory(tmp_path)
    rd.write_summary(runtime_manifest=m)  # running: fine
    with pytest.raises(MetricSchemaError, match="collector_backend_device"):
        rd.update_summary(status="completed", end_time=1.0)
