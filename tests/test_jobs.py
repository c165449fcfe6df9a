"""`raylab train` as a Ray job on a real local head node (token authentication on).

The job is submitted with the real `ray job submit` CLI, exactly as cluster/README.md shows
(RAY_AUTH_MODE=token and RAY_AUTH_TOKEN carried by the client). It must join the running
cluster (no second Ray) and write its run directory under the training.log_root it was given.
The head is the session's (conftest.py, ``ray_head``).

The runtime_env of cluster/runtime_env.yaml is not used here: on this machine it would clone
the whole virtualenv (torch included) for the job; raylab is already installed on this "node".
tests/test_cluster_configs.py validates that file.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import time
from pathlib import Path

import pytest
from heads import RAY, cli_submit

from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary

pytestmark = pytest.mark.slow

EXIT_AFTER_CHECKPOINT_S = 10  # a stopped run exits within 10 s of its final checkpoint


@pytest.fixture
def head(idle_head):
    # The session's head (conftest.py): `ray job stop` sends SIGTERM, then SIGKILL after
    # RAY_JOB_STOP_WAIT_TIME_S (Ray's default 3 s; the head sets 120 s, as the cluster configs
    # do, so the run can checkpoint and close).
    return idle_head


def test_the_readme_job_joins_the_cluster_and_writes_under_log_root(head, tmp_path):
    """cluster/README.md's job: `raylab train` of APPO on microduck_balance with the default
    layout (which fits a 2-CPU node: test_resources.py), submitted with `ray job submit`."""
    log_root = tmp_path / "shared" / "raylab-runs"  # the "shared storage" the job names
    entrypoint = (
        "raylab train --algo appo --task microduck_balance training.time_budget_s=12 "
        "training.eval_every=0 training.eval_before_train=false "
        f"training.checkpoint_every=0 training.terminal=plain training.log_root={log_root}"
    )
    job_id = cli_submit(head, entrypoint, {"env_vars": {"RAYLAB_TEST_JOB": "1"}})
    status = head.wait_job(job_id, timeout=360)
    logs = head.client().get_job_logs(job_id)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "waiting for the Ray cluster" not in logs  # the default layout fits at once

    # It joined the head (the job supervisor's RAY_ADDRESS), and started no Ray of its own.
    assert f"joining Ray cluster at {head.gcs_address} (Ray job)" in logs
    assert "Started a local Ray instance" not in logs

    # The run directory is where the job said.
    runs = sorted(p for p in log_root.iterdir() if p.is_dir())
    assert len(runs) == 1, runs
    run_dir = runs[0]
    assert f"run directory: {run_dir}" in logs
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["env_steps"] > 0
    config = json.loads((run_dir / "run_config.json").read_text())
    assert config["training"]["log_root"] == str(log_root)
    # The runtime manifest names exactly the head's node: the job ran on this cluster.
    head_nodes = {n["node_id"] for n in head.nodes()}
    manifest = summary["runtime_manifest"]
    assert {n["node_id"] for n in manifest["nodes"]} == head_nodes
    assert {a["node_id"] for a in manifest["env_runners"] + manifest["learners"]} <= head_nodes
    # Tune's experiment (checkpoint at the end) lives inside the run directory too.
    assert list((run_dir / "tune").glob("*/checkpoint_*")), "no checkpoint under run_dir/tune"

    # Canonical event files, read back with the fail-closed reader.
    table = extract(run_dir)
    assert S.PERF_TOTAL_FPS in table.tags and S.PERF_ITERATION_TIME in table.tags
    fps = [v for step, v in table.column(S.PERF_TOTAL_FPS) if step > 0]
    assert len(fps) >= 2 and all(v > 0 for v in fps)
    steps = table.steps
    assert steps == sorted(steps) and steps[-1] == summary["env_steps"]


def test_a_job_without_a_cluster_address_refuses_to_start_its_own_ray(head, tmp_path):
    """With RAY_ADDRESS removed inside the job, raylab stops with one line: no second Ray."""
    entrypoint = (
        "env -u RAY_ADDRESS raylab train --algo appo --task Pendulum-v1 "
        f"training.log_root={tmp_path / 'runs'}"
    )
    job_id = cli_submit(head, entrypoint, {})
    status = head.wait_job(job_id, timeout=180)
    logs = head.client().get_job_logs(job_id)
    assert status == "FAILED", logs[-3000:]
    errors = [line for line in logs.splitlines() if line.startswith("raylab: error:")]
    assert len(errors) == 1 and "refusing to start a second Ray" in errors[0], logs[-3000:]
    assert "Traceback" not in logs
    assert "Started a local Ray instance" not in logs


def test_ray_job_stop_checkpoints_and_marks_an_external_cancellation(head, tmp_path):
    log_root = tmp_path / "runs"
    entrypoint = (
        "raylab train --algo appo --task Pendulum-v1 env.num_envs=8 training.time_budget_s=600 "
        "training.eval_every=0 training.eval_before_train=false "
        f"training.checkpoint_every=0 training.terminal=plain training.log_root={log_root}"
    )
    job_id = cli_submit(head, entrypoint, {})
    deadline = time.time() + 300
    run = None
    while time.time() < deadline:
        runs = [p for p in log_root.iterdir() if p.is_dir()] if log_root.is_dir() else []
        if runs and (runs[0] / "run_summary.json").is_file():
            run = runs[0]
            if read_summary(run).get("training_iteration", 0) >= 3:
                break
        time.sleep(1.0)
    else:
        raise AssertionError(head.client().get_job_logs(job_id)[-3000:])
    t0 = time.time()
    r = subprocess.run(
        [RAY, "job", "stop", "--address", head.url, job_id],
        env=head.env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    status = head.wait_job(job_id, timeout=150)
    logs = head.client().get_job_logs(job_id)
    assert status == "STOPPED", logs[-3000:]
    assert time.time() - t0 < 120, "SIGKILLed at the stop wait, not stopped by raylab"
    summary = read_summary(run)
    assert summary["status"] == "interrupted", (summary, logs[-3000:])
    assert summary["stop_reason"] == "external_cancellation"
    assert summary["end_time"] and summary["final_metrics"] and summary["runtime_manifest"]
    # The checkpoint at the end holds the last iteration (checkpoint_every=0: only that one),
    # written after the stop, and the driver exits within 10 s of it (SIGTERM: the stop ends
    # the run after the current iteration, docs/training.md).
    checkpoint = summary["last_checkpoint"]
    assert checkpoint and os.path.isdir(checkpoint)
    with open(os.path.join(checkpoint, "algorithm_state.pkl"), "rb") as fh:
        state = pickle.load(fh)
    assert int(state["training_iteration"]) == summary["training_iteration"]
    written = max(f.stat().st_mtime for f in Path(checkpoint).rglob("*") if f.is_file())
    assert written >= t0, "the final checkpoint predates the stop"
    ended = head.client().get_job_info(job_id).end_time / 1000.0
    assert ended - written <= EXIT_AFTER_CHECKPOINT_S, (ended - written, logs[-3000:])
    assert "raylab: stopping after this iteration" in logs
    assert f"raylab: run interrupted; logs, summary and checkpoints in {run}" in logs
