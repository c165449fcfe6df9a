"""The real local Ray head (tests/heads.py) and what a user meets joining it: token
authentication on the job API and the CLI, one-line refusals for a missing token or an
unreachable address, and a stop that leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error

import pytest
from heads import RAY, RAYLAB, LocalHead, free_port

# ------------------------------------------------------------------------------ tests


@pytest.fixture
def head(idle_head):
    return idle_head


def test_head_keeps_token_authentication_on(head):
    # The job API answers with the head's token ...
    assert head.get("/api/version")["ray_version"]
    # ... and refuses requests without one (401) or with a wrong one (403).
    with pytest.raises(urllib.error.HTTPError) as missing:
        head.get("/api/version", token=None)
    assert missing.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as wrong:
        head.get("/api/version", token="0" * 64)
    assert wrong.value.code == 403


def test_ray_job_cli_needs_the_token(head):
    """`ray job list` (the CLI users run) works with RAY_AUTH_MODE=token + RAY_AUTH_TOKEN only."""
    ok = subprocess.run(
        [RAY, "job", "list", "--address", head.url],
        env=head.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    refused = subprocess.run(
        [RAY, "job", "list", "--address", head.url],
        env=head.env(with_token=False)
        | {"HOME": head.temp_dir},  # no ~/.ray/auth_token to fall back on
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "authentication" in (refused.stdout + refused.stderr).lower()


def test_joining_without_the_token_fails_with_one_line(head, tmp_path):
    env = head.env(with_token=False) | {"HOME": head.temp_dir}  # no ~/.ray/auth_token either
    r = subprocess.run(
        [
            RAYLAB,
            "train",
            "--algo",
            "appo",
            "--task",
            "Pendulum-v1",
            f"resources.ray_address={head.gcs_address}",
            f"training.log_root={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("raylab: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert f"cannot join the Ray cluster at {head.gcs_address}" in errors[0]
    assert "token authentication" in errors[0] and "RAY_AUTH_TOKEN" in errors[0]


def test_unreachable_cluster_address_fails_fast_with_one_line(tmp_path):
    port = free_port()  # nothing listens there
    t0 = time.time()
    r = subprocess.run(
        [
            RAYLAB,
            "train",
            "--algo",
            "appo",
            "--task",
            "Pendulum-v1",
            f"resources.ray_address=127.0.0.1:{port}",
            f"training.log_root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and time.time() - t0 < 60, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("raylab: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}: Connection refused" in errors[0]


def test_stop_leaves_no_process_behind():
    """A head of its own (its subject is stopping a head): after stop() nothing of it is
    left, and stopping twice is harmless."""
    head = LocalHead(num_cpus=1).start()
    try:
        assert head.leftover_pids(), "the head's processes are found by its temp dir / token"
        head.stop()
        assert head.leftover_pids() == []
        assert not os.path.exists(head.temp_dir)
    finally:
        head.stop()  # stopping twice is harmless
