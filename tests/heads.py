"""A real local Ray head node for the tests (``ray start --head``), shared by the session.

``LocalHead`` runs ``ray start --head --block`` in a process group of its own, with token
authentication on (a fresh random token in ``RAY_AUTH_TOKEN``), its own temp dir and its own
ports, so it never touches another Ray on this machine (no ``ray stop``). ``stop()`` stops the
jobs it ran, ends the process group and then any process that still carries its temp dir or its
token (job drivers run in sessions of their own), so nothing outlives the head, also on failure.

Ray maps ``127.0.0.1`` to the machine's own address for the GCS and the raylet (a Linux Ray
node is never loopback-only); the dashboard / job API listens on loopback only.

conftest.py starts one for the whole session (the ``ray_head`` fixture, docs/testing.md);
test_cluster_head.py starts a small one of its own to test stopping a head.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

VENV_BIN = os.path.dirname(sys.executable)
RAY = shutil.which("ray", path=VENV_BIN) or "ray"
RAYLAB = shutil.which("raylab", path=VENV_BIN) or "raylab"
TERMINAL_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalHead:
    """One real Ray head node on this machine, token authentication on."""

    def __init__(
        self,
        num_cpus: Optional[int] = 3,
        resources: Optional[Dict[str, float]] = None,
        head_env: Optional[Dict[str, str]] = None,
    ):
        """num_cpus=None: Ray's default, the machine's cores (2 on the CI machine); head_env:
        environment variables of the head's processes (such as RAY_JOB_STOP_WAIT_TIME_S)."""
        self.head_env = dict(head_env or {})
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.token = secrets.token_hex(32)
        self.temp_dir = tempfile.mkdtemp(prefix="rlh", dir="/tmp")  # short: socket path limit
        self.port = free_port()
        self.dashboard_port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = Path(self.temp_dir) / "ray-start.log"
        self.job_ids: List[str] = []
        self._client = None
        self._stopped = False

    # ------------------------------------------------------------------ addresses and env
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def gcs_address(self) -> str:
        """The cluster address the head wrote for `ray start --address` / RAY_ADDRESS."""
        return (Path(self.temp_dir) / "ray_current_cluster").read_text().strip()

    def env(self, with_token: bool = True) -> Dict[str, str]:
        """Environment of a client of this head: token auth on and this head's token."""
        env = dict(os.environ)
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
            env.pop(key, None)
        env["RAY_AUTH_MODE"] = "token"
        if with_token:
            env["RAY_AUTH_TOKEN"] = self.token
        env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 120.0) -> "LocalHead":
        cmd = [
            RAY,
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            f"--port={self.port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            f"--temp-dir={self.temp_dir}",
            "--num-gpus=0",
        ]
        if self.num_cpus is not None:
            cmd.append(f"--num-cpus={self.num_cpus}")
        if self.resources:
            cmd.append(f"--resources={json.dumps(self.resources)}")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            env={**self.env(), **self.head_env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/api/version")
                if (Path(self.temp_dir) / "ray_current_cluster").is_file():
                    return self
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(1.0)
        raise RuntimeError(f"Ray head not up after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop jobs, the head's process group and every process left with its dir / token."""
        if self._stopped:
            return
        self._stopped = True
        try:
            client = self._client
            for job_id in self.job_ids:
                try:
                    if client is not None and client.get_job_status(job_id).value not in (
                        TERMINAL_JOB_STATES
                    ):
                        client.stop_job(job_id)
                except Exception:
                    pass
        finally:
            if self.proc is not None:
                # SIGTERM to `ray start --block` alone: it drains the node through the GCS,
                # then ends its children. Whatever is left of the group is killed after it.
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGTERM)
                    try:
                        self.proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        pass
                _signal_group(self.proc.pid, signal.SIGKILL)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            for _ in range(3):
                left = self.leftover_pids()
                if not left:
                    break
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.5)
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def stop_jobs(self) -> None:
        """Stop every job this head ran that has not ended (`ray job stop`'s request)."""
        for job_id in self.job_ids:
            try:
                if self.client().get_job_status(job_id).value not in TERMINAL_JOB_STATES:
                    self.client().stop_job(job_id)
            except Exception:
                pass

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Wait until no actor of an earlier test is left (a killed driver's actors end by
        fate sharing, a stopped job's a little later), so the next scenario gets the whole
        head. A head still busy after ``timeout`` fails the test that asked, naming what is
        left."""
        self.stop_jobs()
        deadline = time.time() + timeout
        left: List[str] = []
        while time.time() < deadline:
            left = [
                f"{a.get('class_name')} ({a['state']})"
                for a in self.actors()
                if a["state"] != "DEAD"
            ]
            if not left:
                return
            time.sleep(0.5)
        raise AssertionError(f"the shared Ray head is still busy after {timeout:.0f} s: {left}")

    def leftover_pids(self) -> List[int]:
        """Live processes that belong to this head: its temp dir on the command line or its
        (unique, random) token in the environment."""
        mine = []
        needle_dir = self.temp_dir.encode()
        needle_tok = f"RAY_AUTH_TOKEN={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue  # a zombie: already dead
            if needle_dir in cmdline or needle_tok in environ.split(b"\0"):
                mine.append(int(entry))
        return mine

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "LocalHead":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP and jobs
    def get(self, path: str, token: Optional[str] = "own") -> dict:
        headers = (
            self.headers
            if token == "own"
            else ({"Authorization": f"Bearer {token}"} if token else {})
        )
        req = urllib.request.Request(self.url + path, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode())

    def nodes(self) -> List[dict]:
        """The cluster's nodes from the state API (``/api/v0/nodes``)."""
        return self.get("/api/v0/nodes?limit=1000&detail=1")["data"]["result"]["result"]

    def actors(self) -> List[dict]:
        """Every actor with its details (the endpoint behind ray.util.state.list_actors)."""
        return self.get("/api/v0/actors?limit=10000&detail=1")["data"]["result"]["result"]

    def client(self):
        """A JobSubmissionClient for this head that carries the token explicitly."""
        from ray.job_submission import JobSubmissionClient

        if self._client is None:
            self._client = JobSubmissionClient(self.url, headers=self.headers)
        return self._client

    def submit(self, entrypoint: str, timeout: float = 90.0, **kwargs) -> str:
        """Submit a job; retries while the head's job agent is still starting."""
        deadline = time.time() + timeout
        while True:
            try:
                job_id = self.client().submit_job(entrypoint=entrypoint, **kwargs)
                self.job_ids.append(job_id)
                return job_id
            except RuntimeError as e:
                if "No available agent" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(2.0)

    def wait_job(self, job_id: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.client().get_job_status(job_id).value
            if status in TERMINAL_JOB_STATES:
                return status
            time.sleep(2.0)
        return self.client().get_job_status(job_id).value


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def cli_submit(head: LocalHead, entrypoint: str, runtime_env: dict, timeout: float = 90.0) -> str:
    """`ray job submit --no-wait` with the client environment a user has (token carried);
    retries while the head's job agent is still starting ("No available agent")."""
    import shlex

    submission_id = f"raylab-test-{time.time_ns()}"
    cmd = [
        RAY,
        "job",
        "submit",
        "--address",
        head.url,
        "--submission-id",
        submission_id,
        "--runtime-env-json",
        json.dumps(runtime_env),
        "--no-wait",
        "--",
        *shlex.split(entrypoint),
    ]
    deadline = time.time() + timeout
    while True:
        r = subprocess.run(cmd, env=head.env(), capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            head.job_ids.append(submission_id)
            return submission_id
        if "No available agent" not in r.stdout + r.stderr or time.time() > deadline:
            raise AssertionError(f"ray job submit failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        time.sleep(2.0)
