"""Tune's driver must not keep every trial result alive
(``raylab.algorithms.rllib_compat.release_resolved_trial_futures``).

Ray 2.60's actor manager keeps the future of every task it runs on a trial's actor until the
actor is removed, so each result of a long run stayed in the object store (found by a
30-minute soak: about 1 MB a minute). Real Tune runs of a small Trainable, as it ships and with
raylab's fix, in their own processes (the fix patches Tune for the process)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # two real Tune experiments of 150 results, in their own processes

SCRIPT = REPO / "tests" / "fixtures" / "tune_result_refs.py"
RESULTS = 150


def _driver_refs(tmp_path, mode: str) -> int:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(RESULTS), str(tmp_path / mode), mode],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("refs="), r.stdout[-2000:]
    return int(last.partition("=")[2])


def test_the_driver_holds_only_pending_trial_results(tmp_path):
    fixed = _driver_refs(tmp_path, "fix")
    shipped = _driver_refs(tmp_path, "nofix")
    # As shipped, one reference per result the trial reported; with the fix, the results in
    # flight and Tune's few others, however long the run.
    assert shipped >= RESULTS, shipped
    assert fixed < 30, fixed
