"""A run's resource request held against the cluster before anything waits (raylab.placement).

The slow tests use the session's real head (``ray start --head``, token authentication on;
conftest.py), whose CPUs they read from the state API:
- a request that can never fit fails with one line and exit code 2 within seconds, and claims
  no run directory;
- a request that fits but finds the cluster busy prints what it waits for and fails after
  ``resources.wait_s`` with the same one line.
The README's main job through ``ray job submit`` is tests/test_jobs.py's first test; that its
default layout fits a 2-CPU node (Ray's default head on the CI machine) is checked here, from
its bundles.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from heads import RAYLAB, LocalHead

from raylab.algorithms.build import build_algorithm_config
from raylab.config import compose
from raylab.placement import (
    alternatives,
    fits,
    requested_bundles,
    status_has_autoscaling_config,
)
from raylab.train import algorithm_class


def _bundles(algo, task="microduck_balance", *overrides):
    cfg = compose(algo, task, "mujoco", list(overrides))
    return requested_bundles(algorithm_class(algo), build_algorithm_config(cfg))


@pytest.mark.parametrize("algo", ["ppo", "appo", "sac"])
def test_the_default_layout_asks_for_two_cpus_so_a_two_cpu_node_fits(algo):
    bundles, strategy = _bundles(algo)
    assert strategy == "PACK"
    # The algorithm's main process and one Learner, half a CPU each (the one coordinates, the
    # other mostly waits on the collector), and one EnvRunner with a whole CPU.
    assert sorted(b["CPU"] for b in bundles) == [0.5, 0.5, 1.0]
    assert fits(bundles, [{"CPU": 2.0}])
    assert not fits(bundles, [{"CPU": 1.0}])


def test_bundles_follow_the_resources_options():
    bundles, _ = _bundles(
        "appo",
        "microduck_balance",
        "resources.num_env_runners=3",
        "resources.num_cpus_per_env_runner=0.5",
        "resources.num_cpus_for_main_process=1",
    )
    assert sorted(b["CPU"] for b in bundles) == [0.5, 0.5, 0.5, 0.5, 1.0]
    # Learning inside the main process: its bundle takes the learner's CPUs (next to the
    # EnvRunner's).
    bundles, _ = _bundles(
        "appo", "microduck_balance", "resources.num_learners=0", "resources.num_cpus_per_learner=2"
    )
    assert sorted(b["CPU"] for b in bundles) == [1.0, 2.0]


def test_fits_places_each_bundle_on_one_node():
    assert fits([{"CPU": 2}, {"CPU": 2}], [{"CPU": 2}, {"CPU": 2}])
    assert not fits([{"CPU": 3}], [{"CPU": 2}, {"CPU": 2}])  # 4 in all, but no node has 3
    assert not fits([{"CPU": 1, "GPU": 1}], [{"CPU": 8}])
    assert fits([{"CPU": 1, "GPU": 1}, {"CPU": 4}], [{"CPU": 4}, {"CPU": 2, "GPU": 1}])
    assert fits([{"CPU": 1, "raylab_learner": 1}], [{"CPU": 1, "raylab_learner": 1}])
    assert not fits([{"CPU": 1, "raylab_learner": 1}], [{"CPU": 8}])


def test_alternatives_are_overrides_that_really_fit():
    cfg = compose("appo", "microduck_balance", "mujoco", ["resources.num_env_runners=3"])
    trainable = algorithm_class("appo")
    algo_config = build_algorithm_config(cfg)
    nodes = [{"CPU": 2.0}]
    bundles, _ = requested_bundles(trainable, algo_config)
    assert not fits(bundles, nodes)
    alts = alternatives(trainable, algo_config, cfg, nodes)
    assert alts and alts[0] == "resources.num_env_runners=1"
    for alt in alts:  # composed as a user would type them, each fits
        typed = ["resources.num_env_runners=3", *alt.split()]
        fixed = compose("appo", "microduck_balance", "mujoco", typed)
        assert fits(requested_bundles(trainable, build_algorithm_config(fixed))[0], nodes), alt


def test_autoscaler_detection_from_the_monitor_status_report():
    # The report of `ray start --head` without an autoscaling config (read-only monitor): each
    # node is its own anonymous type. Captured from a real head on this machine.
    readonly = {
        "autoscaler_report": {
            "active_nodes": {"node_49740b3235e32bb03e70d994eda02897099c1cc283f4490329ac0329": 1},
            "idle_nodes": None,
            "pending_nodes": [],
            "pending_launches": {},
        }
    }
    named = {
        "autoscaler_report": {
            "active_nodes": {"ray.head.default": 1},
            "pending_nodes": [],
            "pending_launches": {"ray.worker.cpu": 1},
        }
    }
    assert not status_has_autoscaling_config(json.dumps(readonly).encode())
    assert status_has_autoscaling_config(json.dumps(named).encode())
    assert not status_has_autoscaling_config(None)
    assert not status_has_autoscaling_config(b"not json")


def test_bad_resource_values_are_one_line():
    from raylab.errors import UserError

    with pytest.raises(UserError, match=r"resources.wait_s=-1: must be at least 0"):
        compose("appo", "microduck_balance", "mujoco", ["resources.wait_s=-1"])


# ------------------------------------------------------------------ against a real head


@pytest.fixture
def default_head(idle_head):
    return idle_head


def _cluster_cpus(head: LocalHead) -> int:
    return int(sum(n["resources_total"].get("CPU", 0) for n in head.nodes()))


def _train(head: LocalHead, tmp_path, *overrides, timeout=300):
    env = head.env()
    env["RAY_ADDRESS"] = head.gcs_address
    t0 = time.monotonic()
    r = subprocess.run(
        [
            RAYLAB,
            "train",
            "--algo",
            "appo",
            "--task",
            "microduck_balance",
            "training.terminal=plain",
            f"training.log_root={tmp_path / 'runs'}",
            *overrides,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r, time.monotonic() - t0


@pytest.mark.slow
def test_an_infeasible_request_fails_in_seconds_with_one_line(default_head, tmp_path):
    cpus = _cluster_cpus(default_head)
    r, wall = _train(default_head, tmp_path, f"resources.num_env_runners={cpus + 1}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert wall < 60, wall
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("raylab: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = errors[0]
    assert f"this run needs {cpus + 2:g} CPU" in line  # cpus+1 EnvRunners, 0.5 + 0.5
    assert f"the Ray cluster has {cpus:g} CPU on 1 node(s)" in line
    assert "no autoscaler can add nodes" in line
    assert "overrides that fit: resources.num_env_runners=" in line
    assert not (tmp_path / "runs").exists()  # no run directory claimed


HOLDER = """
import ray, sys, time
ray.init()
pg = ray.util.placement_group([{"CPU": float(sys.argv[1])}])
ray.get(pg.ready())
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_busy_cluster_is_waited_for_with_progress_then_one_line(default_head, tmp_path):
    cpus = _cluster_cpus(default_head)
    env = default_head.env()
    env["RAY_ADDRESS"] = default_head.gcs_address
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cpus)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        r, wall = _train(default_head, tmp_path, "resources.wait_s=5")
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2, r.stderr[-3000:]
    assert 5 <= wall < 90, wall
    assert "raylab: waiting for the Ray cluster to grant 2 CPU" in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("raylab: error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    assert "not granted within resources.wait_s=5 s" in errors[0]
    assert not (tmp_path / "runs").exists()
