"""The cluster configs in cluster/: they parse, validate, split learners onto GPU nodes, keep
token authentication on, and every raylab command they or cluster/README.md show is real.

- The launcher YAML goes through Ray's own `ray up` preparation and schema validation.
- The KubeRay manifests are checked for the fields that matter here (the CRD schema is not
  available offline; they were validated against KubeRay's CRDs when written).
- The runtime environment is validated by ray.runtime_env.RuntimeEnv, and the package Ray would
  upload for it is built with Ray's own packager.
- Each `raylab train` / `raylab tune` command is parsed by raylab's CLI parser and its
  overrides composed (train) or its sweep file loaded (tune), as the command itself would.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
LAUNCHER = CLUSTER / "raylab-cluster.yaml"
RAYCLUSTER = CLUSTER / "kuberay" / "raycluster.yaml"
RAYJOB = CLUSTER / "kuberay" / "rayjob.yaml"
RUNTIME_ENV = CLUSTER / "runtime_env.yaml"
README = CLUSTER / "README.md"

LEARNER_RES, RUNNER_RES = "raylab_learner", "raylab_env_runner"
GPU_KEY = "nvidia.com/gpu"


def _docs(path: Path) -> List[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kind(path: Path, kind: str) -> dict:
    (doc,) = [d for d in _docs(path) if d.get("kind") == kind]
    return doc


def test_every_yaml_file_in_cluster_parses():
    files = sorted(CLUSTER.rglob("*.yaml"))
    assert {LAUNCHER, RAYCLUSTER, RAYJOB, RUNTIME_ENV} <= set(files)
    for path in files:
        assert _docs(path), path


# ------------------------------------------------------------------------ cluster launcher


def test_launcher_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(yaml.safe_load(LAUNCHER.read_text())))
    validate_config(config)  # what `ray up` runs before it starts anything
    assert config["head_node_type"] == "head"


def test_launcher_puts_gpus_and_learners_on_the_gpu_type_only():
    config = yaml.safe_load(LAUNCHER.read_text())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]["resources"]
    assert head.get("GPU", 0) == 0 and LEARNER_RES not in head and RUNNER_RES not in head
    gpu_types = {n for n, t in types.items() if t["resources"].get("GPU", 0) > 0}
    learner_types = {n for n, t in types.items() if t["resources"].get(LEARNER_RES, 0) > 0}
    runner_types = {n for n, t in types.items() if t["resources"].get(RUNNER_RES, 0) > 0}
    assert gpu_types and gpu_types == learner_types
    assert runner_types and not runner_types & gpu_types
    for name in gpu_types:  # one learner per GPU, and a GPU is there when a run starts
        res = types[name]["resources"]
        assert res[LEARNER_RES] == res["GPU"] and types[name]["min_workers"] >= 1
        assert "cu1" in " ".join(types[name]["worker_setup_commands"])  # CUDA torch there
    for name in runner_types:
        assert "whl/cpu" in " ".join(types[name]["worker_setup_commands"])


def test_launcher_keeps_token_auth_on_and_carries_the_token():
    config = yaml.safe_load(LAUNCHER.read_text())
    starts = [
        c
        for key in ("head_start_ray_commands", "worker_start_ray_commands")
        for c in config[key]
        if "ray start" in c
    ]
    assert len(starts) == 2
    assert all(re.search(r"RAY_AUTH_MODE=token (\w+=\S+ )*ray start", c) for c in starts)
    assert "RAY_AUTH_MODE=disabled" not in LAUNCHER.read_text()
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert "--dashboard-host=127.0.0.1" in starts[0]
    assert config["docker"]["image"].startswith(f"rayproject/ray:{ray.__version__}-py311")


# ------------------------------------------------------------------------ KubeRay


def _custom_resources(start_params: dict) -> Dict[str, float]:
    """KubeRay's rayStartParams.resources: a JSON object inside a quoted string."""
    raw = start_params.get("resources")
    if raw is None:
        return {}
    value = json.loads(raw)
    return json.loads(value) if isinstance(value, str) else value


def _groups(spec: dict) -> Dict[str, dict]:
    groups = {"head": spec["headGroupSpec"]}
    groups.update({g["groupName"]: g for g in spec["workerGroupSpecs"]})
    return groups


def _containers(group: dict) -> List[dict]:
    return group["template"]["spec"]["containers"]


def _gpus(group: dict) -> float:
    total = 0.0
    for c in _containers(group):
        res = c.get("resources", {})
        total += float(res.get("limits", {}).get(GPU_KEY, 0))
        assert float(res.get("requests", {}).get(GPU_KEY, 0)) == float(
            res.get("limits", {}).get(GPU_KEY, 0)
        )
    return total


@pytest.mark.parametrize("path,kind", [(RAYCLUSTER, "RayCluster"), (RAYJOB, "RayJob")])
def test_kuberay_manifest_splits_learners_onto_gpu_pods(path, kind):
    doc = _kind(path, kind)
    assert doc["apiVersion"] == "ray.io/v1"
    spec = doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == ray.__version__
    groups = _groups(spec)
    head = groups.pop("head")
    assert _gpus(head) == 0 and not _custom_resources(head["rayStartParams"])
    learner_groups = {
        n for n, g in groups.items() if _custom_resources(g["rayStartParams"]).get(LEARNER_RES)
    }
    gpu_groups = {n for n, g in groups.items() if _gpus(g) > 0}
    runner_groups = {
        n for n, g in groups.items() if _custom_resources(g["rayStartParams"]).get(RUNNER_RES)
    }
    assert gpu_groups and gpu_groups == learner_groups
    assert runner_groups and not runner_groups & gpu_groups
    for name in gpu_groups:
        g = groups[name]
        assert _custom_resources(g["rayStartParams"])[LEARNER_RES] == _gpus(g)
        assert g["minReplicas"] >= 1
    # Every image is this Ray version; every pod mounts the shared run storage.
    for g in [head, *groups.values()]:
        for c in _containers(g):
            assert c["image"].startswith(f"rayproject/ray:{ray.__version__}-py311")
            assert any(m["mountPath"] == "/mnt/raylab" for m in c.get("volumeMounts", []))


@pytest.mark.parametrize("path,kind", [(RAYCLUSTER, "RayCluster"), (RAYJOB, "RayJob")])
def test_kuberay_manifest_keeps_token_auth_on(path, kind):
    doc = _kind(path, kind)
    spec = doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"]
    assert spec["authOptions"]["mode"] == "token"
    for g in _groups(spec).values():
        for c in _containers(g):
            for env in c.get("env", []):
                assert not (env["name"] == "RAY_AUTH_MODE" and env.get("value") != "token")


def test_raycluster_volume_claim_is_shared_by_all_pods():
    pvc = _kind(RAYCLUSTER, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    spec = _kind(RAYCLUSTER, "RayCluster")["spec"]
    for g in _groups(spec).values():
        claims = [v["persistentVolumeClaim"]["claimName"] for v in g["template"]["spec"]["volumes"]]
        assert claims == [pvc["metadata"]["name"]]


# ------------------------------------------------------------------------ runtime env


def test_runtime_env_is_valid_and_installs_the_uploaded_checkout():
    from ray.runtime_env import RuntimeEnv

    data = yaml.safe_load(RUNTIME_ENV.read_text())
    RuntimeEnv(**data)  # Ray's own validation of the fields
    assert data["working_dir"] == "."
    assert data["pip"]["packages"] == ["${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}"]
    # The RayJob carries the same installation, from a remote zip of the checkout.
    job_env = yaml.safe_load(_kind(RAYJOB, "RayJob")["spec"]["runtimeEnvYAML"])
    RuntimeEnv(**job_env)
    assert job_env["pip"] == data["pip"]
    assert re.match(r"^(s3|gs|https)://.+\.zip$", job_env["working_dir"])


def test_runtime_env_package_is_small_and_holds_raylab(tmp_path):
    """Build the zip `ray job submit --runtime-env cluster/runtime_env.yaml` would upload."""
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE, create_package

    data = yaml.safe_load(RUNTIME_ENV.read_text())
    package = tmp_path / "working_dir.zip"
    # include_gitignore=False: the excludes alone must keep the virtualenv and runs out.
    create_package(str(REPO), package, include_gitignore=False, excludes=data["excludes"])
    size = package.stat().st_size
    assert size < 50 * 2**20 and size < GCS_STORAGE_MAX_SIZE
    names = set(zipfile.ZipFile(package).namelist())
    for needed in (
        "pyproject.toml",
        "raylab/train.py",
        "raylab/cli.py",
        "envs/__init__.py",
        "algorithms/build.py",
        "envs/assets/microduck.xml",
        "tune_configs/appo_microduck_balance.yaml",
    ):
        assert needed in names, needed
    for banned in (".venv/", ".git/", "logs/", "runs/", "build/"):
        assert not any(n.startswith(banned) for n in names), banned


# ------------------------------------------------------------------------ commands


def _code_lines(markdown: str) -> List[str]:
    """Logical lines (backslash continuations joined) of the fenced code blocks."""
    lines, inside, current = [], False, ""
    for raw in markdown.splitlines():
        if raw.strip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return lines


def _raylab_argv(line: str) -> List[str]:
    tokens = shlex.split(line, comments=True)
    for i, tok in enumerate(tokens[:-1]):
        if tok == "raylab" and tokens[i + 1] in ("train", "tune"):
            return tokens[i + 1 :]
    return []


def documented_commands() -> Dict[str, List[List[str]]]:
    """argv (after `raylab`) of every raylab command in README, the RayJob and the launcher."""
    out = {"README.md": [], "rayjob.yaml": [], "raylab-cluster.yaml": []}
    for line in _code_lines(README.read_text()):
        if argv := _raylab_argv(line):
            assert line.startswith("ray job submit "), f"not submitted as a Ray job: {line}"
            out["README.md"].append(argv)
    out["rayjob.yaml"].append(_raylab_argv(_kind(RAYJOB, "RayJob")["spec"]["entrypoint"]))
    header = " ".join(
        line.lstrip("# ").rstrip("\\")
        for line in LAUNCHER.read_text().splitlines()
        if line.startswith("#")
    )
    match = re.search(r"raylab train .*?raylab_learner=1", header)
    out["raylab-cluster.yaml"].append(shlex.split(match.group(0))[1:])
    return out


def _check_command(argv: List[str]):
    from raylab.cli import build_parser
    from raylab.config import compose
    from raylab.sweep import load_spec

    args = build_parser().parse_args(argv)
    if args.command == "tune":
        spec = load_spec(str(REPO / args.file), args.overrides)
        return spec.base
    if args.resume:
        assert not args.overrides
        return None
    return compose(args.algo, args.task, args.sim, args.overrides)


def test_documented_commands_are_real_raylab_commands():
    commands = documented_commands()
    readme = [argv[0] for argv in commands["README.md"]]
    assert readme.count("train") >= 2 and readme.count("tune") >= 1
    for where, argvs in commands.items():
        for argv in argvs:
            assert argv, where
            _check_command(argv)  # raises UserError (one line) on anything invalid


def test_cluster_commands_steer_placement_with_advertised_resources():
    launcher = yaml.safe_load(LAUNCHER.read_text())["available_node_types"]
    advertised = {
        "launcher": {k for t in launcher.values() for k in t["resources"]},
        "raycluster": {
            k
            for g in _groups(_kind(RAYCLUSTER, "RayCluster")["spec"]).values()
            for k in _custom_resources(g["rayStartParams"])
        },
        "rayjob": {
            k
            for g in _groups(_kind(RAYJOB, "RayJob")["spec"]["rayClusterSpec"]).values()
            for k in _custom_resources(g["rayStartParams"])
        },
    }
    steered = 0
    for argvs in documented_commands().values():
        for argv in argvs:
            cfg = _check_command(argv)
            if cfg is None or not cfg.training.log_root:
                continue
            res = cfg.resources
            wanted = set(res.custom_resources_per_env_runner) | set(
                res.custom_resources_per_learner
            )
            for where, names in advertised.items():
                assert wanted <= names, (where, wanted - names)
            if cfg.training.log_root.startswith("/mnt/raylab"):
                steered += 1  # a cluster command: GPU learners on learner nodes only
                assert res.num_gpus_per_learner == 1
                assert dict(res.custom_resources_per_learner) == {LEARNER_RES: 1.0}
                assert dict(res.custom_resources_per_env_runner) == {RUNNER_RES: 1.0}
    assert steered >= 3


def test_readme_keeps_token_auth_on_and_carries_the_token():
    text = README.read_text()
    assert "export RAY_AUTH_MODE=token" in text and "export RAY_AUTH_TOKEN=" in text
    assert "RAY_AUTH_MODE=disabled" not in text
