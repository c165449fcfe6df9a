"""Placement on a simulated multi-node cluster (ray.cluster_utils.Cluster, four raylets here).

Nodes, each with its own CPU count:

- head:      1 CPU (the driver joins here; the Algorithm actor may run here)
- cpu_a:     2 CPUs, advertises raylab_env_runner: 1
- cpu_b:     2 CPUs, advertises raylab_env_runner: 1
- learner:   2 CPUs, advertises raylab_learner: 1 (the "GPU-like" node; no real GPU here,
             so the learner runs on its CPU with num_gpus_per_learner=0)

A real `run_training` (APPO on Pendulum-v1, Tune, RLlib) with
resources.custom_resources_per_env_runner.raylab_env_runner=1 and
resources.custom_resources_per_learner.raylab_learner=1 must put one EnvRunner on each CPU
worker node and the learner on the learner node. That is read from the state API
(ray.util.state.list_actors, which also shows the actor names of the dashboard's actor list) and
from run_summary.json's runtime manifest. The training's gauges must reach the head node's
metrics endpoint, tagged with the run.

The scenario runs in a subprocess with its own RAY_TMPDIR and token (token authentication on),
so nothing leaks into this pytest process or into another Ray on the machine; the subprocess
and every process carrying its temp dir are ended afterwards, also on failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCENARIO_TIMEOUT_S = 420

LAYOUT = {
    "head": {"num_cpus": 1, "resources": {}},
    "cpu_a": {"num_cpus": 2, "resources": {"raylab_env_runner": 1}},
    "cpu_b": {"num_cpus": 2, "resources": {"raylab_env_runner": 1}},
    "learner": {"num_cpus": 2, "resources": {"raylab_learner": 1}},
}


def _scenario(out_path: str, log_dir: str) -> None:
    """Runs in the subprocess: cluster up, one short training, facts to out_path as JSON."""
    import socket
    import urllib.request

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from raylab.config import compose, to_dict
    from raylab.dashboard import gauge_name
    from raylab.metrics import schema as S
    from raylab.metrics.rundir import RunDirectory, resolve_run_dir
    from raylab.train import run_training

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    metrics_port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(
            **LAYOUT["head"],
            include_dashboard=True,
            dashboard_port=free_port(),
            metrics_export_port=metrics_port,
            _system_config={"metrics_report_interval_ms": 1000},
        ),
    )
    try:
        nodes = {"head": cluster.head_node.node_id}
        for name in ("cpu_a", "cpu_b", "learner"):
            nodes[name] = cluster.add_node(**LAYOUT[name]).node_id
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")

        cfg = compose(
            "appo",
            "Pendulum-v1",
            "mujoco",
            [
                "resources.num_env_runners=2",
                "resources.custom_resources_per_env_runner.raylab_env_runner=1",
                "resources.num_learners=1",
                "resources.num_gpus_per_learner=0",
                "resources.custom_resources_per_learner.raylab_learner=1",
                "env.num_envs=4",
                "training.time_budget_s=8",
                "training.checkpoint_every=0",
                "training.terminal=plain",
                f"training.log_dir={log_dir}",
            ],
        )
        run_dir = resolve_run_dir(cfg)
        RunDirectory(run_dir).write_config(to_dict(cfg))
        results = run_training(cfg, run_dir)
        errors = [str(r.error) for r in results if r.error is not None]

        actors = [
            {
                "class_name": a.class_name,
                "repr_name": a.repr_name,
                "node_id": a.node_id,
                "state": a.state,
            }
            for a in list_actors(detail=True, limit=10_000, raise_on_missing_output=False)
        ]
        # The driver's gauges, as the head node's metrics agent exports them.
        wanted = "ray_" + gauge_name(S.PERF_TOTAL_FPS)
        gauge_lines = []
        deadline = time.time() + 40
        while time.time() < deadline and not gauge_lines:
            url = f"http://{ray.util.get_node_ip_address()}:{metrics_port}/metrics"
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            gauge_lines = [
                line
                for line in text.splitlines()
                if line.startswith(wanted + "{") and f'RunName="{run_dir.name}"' in line
            ]
            time.sleep(1.0)
        Path(out_path).write_text(
            json.dumps(
                {
                    "nodes": nodes,
                    "actors": actors,
                    "run_dir": str(run_dir),
                    "errors": errors,
                    "gauge_lines": gauge_lines,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


def _pids_with(needle: bytes):
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    yield int(entry)
            except OSError:
                pass


def _node_loss_scenario(out_path: str, log_dir: str) -> None:
    """Runs in the subprocess: head (learner) + two EnvRunner nodes; one EnvRunner node is
    removed (its raylet and workers killed) while its EnvRunner samples."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from raylab.config import compose, to_dict
    from raylab.metrics.rundir import RunDirectory, read_summary, resolve_run_dir
    from raylab.train import run_training

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=1, resources={"raylab_env_runner": 1})
        doomed = cluster.add_node(num_cpus=1, resources={"raylab_env_runner": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cfg = compose(
            "appo",
            "Pendulum-v1",
            "mujoco",
            [
                "resources.num_env_runners=2",
                "resources.custom_resources_per_env_runner.raylab_env_runner=1",
                "env.num_envs=4",
                "training.time_budget_s=30",
                "training.checkpoint_every=0",
                "training.eval_every=0",
                "training.eval_before_train=false",
                "training.terminal=plain",
                f"training.log_dir={log_dir}",
            ],
        )
        run_dir = resolve_run_dir(cfg)
        RunDirectory(run_dir).write_config(to_dict(cfg))
        at_removal = {}

        def remove_when_sampling():
            deadline = time.time() + 240
            while time.time() < deadline:
                try:
                    if read_summary(run_dir).get("training_iteration", 0) >= 5:
                        break
                except Exception:
                    pass
                time.sleep(0.3)
            at_removal.update(read_summary(run_dir))
            print(f"removing node at iteration {at_removal.get('training_iteration')}", flush=True)
            cluster.remove_node(doomed)
            print("node removed", flush=True)

        remover = threading.Thread(target=remove_when_sampling, daemon=True)
        remover.start()
        results = run_training(cfg, run_dir)
        remover.join(timeout=60)
        Path(out_path).write_text(
            json.dumps(
                {
                    "run_dir": str(run_dir),
                    "errors": [str(r.error) for r in results if r.error is not None],
                    "at_removal": at_removal,
                    "doomed": doomed.node_id,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


def _run_scenario(tmp_path, mode: str):
    """Run a scenario in a subprocess; yield its facts; end every process it left."""
    ray_tmp = tempfile.mkdtemp(prefix="rlc", dir="/tmp")  # short: unix socket path limit
    env = dict(os.environ)
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    env.update(
        RAY_TMPDIR=ray_tmp,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
    )
    out = tmp_path / "facts.json"
    log_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, __file__, str(out), str(log_dir), mode],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        try:
            output, _ = proc.communicate(timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            # What the scenario printed, its driver's stacks among it (faulthandler, below).
            printed = e.output.decode(errors="replace") if isinstance(e.output, bytes) else ""
            message = f"{mode}: still running after {SCENARIO_TIMEOUT_S} s:\n{printed[-8000:]}"
            pytest.fail(message)
        assert proc.returncode == 0 and out.is_file(), output[-5000:]
        yield json.loads(out.read_text()), output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for _ in range(3):
            pids = list(_pids_with(ray_tmp.encode()))
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.5)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture
def scenario(tmp_path):
    yield from _run_scenario(tmp_path, "placement")


@pytest.fixture
def node_loss(tmp_path):
    yield from _run_scenario(tmp_path, "node_loss")


def test_a_worker_node_removed_while_sampling_the_run_continues_on_the_rest(node_loss):
    facts, output = node_loss
    from raylab.metrics.rundir import read_summary

    assert facts["errors"] == [], output[-5000:]
    before = facts["at_removal"]
    assert before.get("training_iteration", 0) >= 5, facts
    summary = read_summary(facts["run_dir"])
    assert summary["status"] == "completed"
    # Training went on after the node was gone, to its time budget, on the node left.
    assert summary["training_iteration"] >= before["training_iteration"] + 5
    assert summary["env_steps"] > before["env_steps"]
    assert summary["time_total_s"] >= 30


def test_env_runners_spread_over_cpu_nodes_and_learner_on_the_learner_node(scenario):
    facts, output = scenario
    from raylab.metrics.rundir import read_summary

    assert facts["errors"] == [], output[-5000:]
    nodes = facts["nodes"]
    name_of = {node_id: name for name, node_id in nodes.items()}

    # The state API (the dashboard's actor list): our actor names, on the intended nodes.
    runners = [a for a in facts["actors"] if (a["repr_name"] or "").startswith("raylab-envrunner-")]
    learners = [a for a in facts["actors"] if (a["repr_name"] or "").startswith("raylab-learner-")]
    assert sorted(a["repr_name"] for a in runners) == ["raylab-envrunner-1", "raylab-envrunner-2"]
    assert [a["repr_name"] for a in learners] == ["raylab-learner-0"]
    assert sorted(name_of[a["node_id"]] for a in runners) == ["cpu_a", "cpu_b"]
    assert name_of[learners[0]["node_id"]] == "learner"

    # The run's own record agrees (runtime manifest in run_summary.json).
    summary = read_summary(facts["run_dir"])
    assert summary["status"] == "completed"
    manifest = summary["runtime_manifest"]
    assert sorted(name_of[r["node_id"]] for r in manifest["env_runners"]) == ["cpu_a", "cpu_b"]
    assert [name_of[r["node_id"]] for r in manifest["learners"]] == ["learner"]
    assert {n["node_id"] for n in manifest["nodes"]} == set(nodes.values())

    # The Tune callback exported the run's gauges to the Ray metrics endpoint.
    assert facts["gauge_lines"], "no ray_raylab_perf_total_fps sample for this run"
    assert 'TrialId="' in facts["gauge_lines"][0]


if __name__ == "__main__":
    import faulthandler

    # A hang shows where: every thread's stack, before the test gives up on the subprocess.
    faulthandler.dump_traceback_later(SCENARIO_TIMEOUT_S - 60, exit=False)
    {"placement": _scenario, "node_loss": _node_loss_scenario}[sys.argv[3]](
        sys.argv[1], sys.argv[2]
    )
