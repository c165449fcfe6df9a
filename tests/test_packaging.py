"""Package layout: envs/ and algorithms/ install as raylab.envs / raylab.algorithms only."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO


def _python(code: str, cwd, extra_path=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_mapped_packages_import_and_no_bare_envs(tmp_path):
    # Run outside the checkout so the repository folder itself is not on sys.path.
    r = _python(
        "import importlib.util, raylab.envs, raylab.algorithms;"
        "print(raylab.envs.__name__, raylab.algorithms.__name__);"
        "print(importlib.util.find_spec('envs'), importlib.util.find_spec('algorithms'))",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "raylab.envs raylab.algorithms"
    assert second == "None None"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    # A quiet build: no deprecation (license), no package setuptools would leave out (assets).
    assert "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    (whl,) = out.glob("raylab-*.whl")
    return whl


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "raylab/envs/__init__.py" in names
    assert "raylab/algorithms/__init__.py" in names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"raylab"}, tops
    xml = [n for n in names if n.startswith("raylab/envs/assets/") and n.endswith(".xml")]
    shipped = sorted(p.name for p in (REPO / "envs" / "assets").glob("*.xml"))
    assert sorted(n.rsplit("/", 1)[1] for n in xml) == shipped
    assert "raylab/terminal/samples.json" in names  # the example frames' recorded samples
    # every package folder in the source tree is in the wheel
    for src, pkg in (
        ("raylab", "raylab"),
        ("envs", "raylab/envs"),
        ("algorithms", "raylab/algorithms"),
    ):
        for init in (REPO / src).rglob("__init__.py"):
            rel = init.relative_to(REPO / src).as_posix()
            assert f"{pkg}/{rel}" in names, (
                f"{pkg}/{rel} missing from the wheel (pyproject packages)"
            )


def test_wheel_install_finds_assets(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    # Drop the editable install's finder so the wheel's copy is the one imported.
    code = (
        "import sys; "
        "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__];"
        "import raylab.envs as e; print(e.__file__);"
        "print(sorted(p.name for p in e.ASSETS.glob('*.xml')))"
    )
    r = _python(code, cwd=tmp_path, extra_path=target)
    assert r.returncode == 0, r.stderr
    path, assets = r.stdout.strip().splitlines()
    assert path.startswith(str(target))
    assert assets == str(sorted(p.name for p in (REPO / "envs" / "assets").glob("*.xml")))
