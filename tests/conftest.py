"""Shared test fixtures."""

from __future__ import annotations

import os
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


@pytest.fixture
def cli():
    return run_cli
