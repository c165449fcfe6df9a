"""Shared test fixtures."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAYLAB = shutil.which("raylab", path=os.path.dirname(sys.executable)) or "raylab"


def run_cli(*args: str, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run the installed `raylab` console command in a subprocess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [RAYLAB, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout
    )


# What a healthy run must not print: a traceback, an ERROR line, a library warning.
NOT_RAYLAB = re.compile(r"Traceback|ERROR|WARNING|Warning\b|warn\(")


def assert_only_raylab_output(output: str) -> None:
    """A healthy run printed raylab's lines only (and the sweep's table): no traceback, no
    ERROR line, no warning of Ray, RLlib, MuJoCo or another library."""
    bad = [line for line in output.splitlines() if NOT_RAYLAB.search(line)]
    assert not bad, "\n".join(bad[:20]) + "\n---\n" + output[-4000:]


@pytest.fixture
def cli():
    return run_cli


# ---------------------------------------------------------------------- the end of the session
# One full-suite run (599 passed) then died with a segmentation fault in the interpreter's own
# finalization, after pytest had printed its summary: native threads of the libraries the tests
# load in this process (torch, MuJoCo's worker pools, Ray's core worker) being torn down in an
# order Python does not control. Every test had reported by then, so the session ends with its
# own exit status without that finalization; a crash inside a test still shows as one (pytest's
# faulthandler prints the stacks).
_EXIT_STATUS = {}


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if "status" not in _EXIT_STATUS or os.environ.get("RAYLAB_TEST_NORMAL_EXIT"):
        return
    from raylab.quiet import flush_std_streams

    flush_std_streams()
    os._exit(_EXIT_STATUS["status"])
