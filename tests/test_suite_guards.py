"""The suite's own guards (tests/conftest.py): a test hung where pytest-timeout cannot reach
it ends its worker with every thread's stack, and the suite goes on; a failed test is named the
moment it reports. Runs a pytest of its own on tests/fixtures/suite_guard_cases.py with two
xdist workers, as `make test` runs the suite (the conftest is the suite's own)."""

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = "tests/fixtures/suite_guard_cases.py"


def test_a_hang_past_the_timeout_ends_its_worker_with_stacks_and_the_suite_goes_on():
    env = {**os.environ, "RAYLAB_TEST_WATCHDOG_GRACE_S": "2"}
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            CASES,
            "-o",
            "python_files=suite_guard_cases.py",
            "-q",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert time.monotonic() - t0 < 100, out  # not the 120 s the hung test sleeps
    # the watchdog printed the stacks (the hung test's frame among them); the worker went down
    # once: the test that hung is not run again by the worker that replaces it
    assert "Timeout (0:00:03)!" in out, out
    assert "in test_blocked_where_the_timeout_cannot_reach" in out, out
    assert out.count("node down") == 1, out
    assert f"FAILED {CASES}::test_blocked_where_the_timeout_cannot_reach (" in out, out
    assert f"FAILED {CASES}::test_fails (call," in out, out
    assert "1 passed" in out and "2 failed" in out, out
