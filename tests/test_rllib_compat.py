"""RLlib's, Tune's and Ray's private names behind one door (algorithms/rllib_compat.py): every
name it lists exists on the installed Ray, nothing else in raylab reaches for a private Ray
name, and another Ray release is refused with one line before Ray starts."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from raylab.algorithms import rllib_compat as C
from raylab.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def _source(cls) -> str:
    """The source of a class and of its bases (where an instance attribute is set)."""
    parts = []
    for klass in inspect.getmro(cls):
        if klass.__module__.startswith("ray."):
            try:
                parts.append(inspect.getsource(klass))
            except (OSError, TypeError):
                pass
    return "\n".join(parts)


def test_every_private_name_raylab_uses_exists_on_the_installed_ray():
    missing = []
    for table in (C.OVERRIDDEN_HOOKS, C.CALLED_METHODS):
        for path, names in table.items():
            cls = C.resolve(path)
            missing += [f"{path}.{n}" for n in names if not callable(getattr(cls, n, None))]
    for path, names in C.INSTANCE_ATTRIBUTES.items():
        source = _source(C.resolve(path))
        missing += [f"{path}.{n}" for n in names if not re.search(rf"self\.{n}\b", source)]
    for module, names in C.MODULE_NAMES.items():
        obj = C.resolve(module)
        missing += [f"{module}.{n}" for n in names if not hasattr(obj, n)]
    assert not missing, f"moved or renamed in this Ray release: {missing}"


def test_a_renamed_name_is_reported():
    """The check above fails when a listed name is gone (it is not a test that cannot fail)."""
    cls = C.resolve("ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner")
    assert not callable(getattr(cls, "_sample_renamed", None))
    assert not re.search(r"self\._seed_renamed\b", _source(cls))
    assert re.search(r"self\._seed\b", _source(cls))


# Private Ray names are allowed in rllib_compat.py only; raylab's own private attributes (on
# its own subclasses) are not Ray's. What an override of a listed hook calls on super() is
# the hook itself.
PRIVATE_RAY = re.compile(
    r"from ray[\w.]*\._\w+|import ray[\w.]*\._\w+|ray\.[\w.]*\._[a-z]\w*"
    r"|\._(?:seed|needs_initial_reset|weights_seq_no|increase_sampled_metrics|log_env_steps"
    r"|metrics_num_env_steps_sampled|threading_lock|old_encoder|old_pi|last_update_ts_by_mid"
    r"|learner_thread_in_queue|get_tensor_variable|internal_kv_get|grad_scalers"
    r"|compute_off_policyness|optimizer_lr_schedules|curr_value)\b"
)


def test_no_other_module_uses_a_private_ray_name():
    offenders = []
    for folder in ("raylab", "algorithms", "envs"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "rllib_compat.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if PRIVATE_RAY.search(code):
                    offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_ray_versions():
    assert C.ray_version_problem("2.60.0") is None
    assert C.ray_version_problem("2.60.3") is None
    for other in ("2.61.0", "2.6.0", "3.0.0"):
        problem = C.ray_version_problem(other)
        assert problem is not None and other in problem and "2.60" in problem
        assert "\n" not in problem
    assert C.ray_version_problem() is None  # the installed one


def test_another_ray_release_is_refused_before_ray_starts(monkeypatch, tmp_path):
    """`raylab train` on a Ray it is not written against: one line, exit code 2, no Ray
    session started (RAY_TMPDIR stays empty), no run directory claimed."""
    from conftest import run_main

    import raylab.train

    monkeypatch.setattr(
        raylab.train, "ray_version_problem", lambda version=None: C.ray_version_problem("2.61.0")
    )
    ray_tmp = tempfile.mkdtemp(prefix="rlnr", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.setenv("RAY_ADDRESS", "")
    try:
        r = run_main("train", "--task", "Pendulum-v1", f"training.log_dir={tmp_path / 'run'}")
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "installed Ray is 2.61.0" in line and "2.60" in line
        assert os.listdir(ray_tmp) == []
        assert not (tmp_path / "run").exists()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    with pytest.raises(UserError):
        raylab.train.check_ray_version()
