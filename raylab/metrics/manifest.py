"""Runtime manifest v1: where a run's processes ran and on what devices.

The manifest is embedded as ``runtime_manifest`` in ``run_summary.json``. It has its own version
(``runtime_manifest.schema_version``), independent of the metric schema version: a metric change
does not invalidate the manifest and vice versa.

Stable v1 fields may not be renamed, removed, retyped or change unit / null meaning without a
new manifest version; optional fields may be added with docs and tests. Everything under
``experimental`` (and the ``shutdown`` / ``backend_diagnostics`` sections) is producer-owned
diagnostics with no stability promise; the validator checks only that they are objects.
Readers reject a missing or unsupported ``schema_version`` and any field they do not know.

:func:`build_manifest` takes plain data (lists of dicts for the actors), so it is testable
without a running algorithm; :func:`collect_cluster_info` and :func:`actor_placement` gather
that data from a live Ray cluster and from inside an actor.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Sequence

from raylab.metrics.schema import MetricSchemaError

RUNTIME_MANIFEST_SCHEMA_VERSION = 1
SUPPORTED_RUNTIME_MANIFEST_VERSIONS = (1,)

# field -> (stability, JSON type, meaning); rendered into docs/metrics.md.
MANIFEST_FIELDS: Dict[str, tuple] = {
    "schema_version": ("stable", "int", "runtime manifest version, 1"),
    "ray_version": ("stable", "str", "Ray version of the driver"),
    "raylab_version": ("stable", "str", "raylab version of the driver"),
    "cluster_resources": ("stable", "object", "Ray cluster resources at start (name -> amount)"),
    "nodes": ("stable", "list", "Ray nodes: node_id, node_ip, hostname, alive, resources"),
    "env_runners": (
        "stable",
        "list",
        "one entry per EnvRunner actor: index, node_id, device, num_envs, num_threads, and "
        "optionally kind (env_runner), pid, node_ip, hostname, accelerator_ids",
    ),
    "learners": (
        "stable",
        "list",
        "one entry per Learner actor: index, node_id, device, and optionally kind (learner), "
        "pid, node_ip, hostname, accelerator_ids",
    ),
    "envs_per_runner": ("stable", "int", "envs stepped together by each EnvRunner"),
    "threads_per_runner": ("stable", "int", "physics threads of each EnvRunner's batched env"),
    "sim_backend": ("stable", "str", "physics backend (mujoco)"),
    "sim_backend_device": (
        "stable",
        "str or null",
        "accelerator the physics backend runs on; null when it has none (CPU MuJoCo)",
    ),
    "collector_metric_interval_s": (
        "stable",
        "number",
        "the collector metric interval: EnvRunners report their metrics with every result, "
        "and a result comes at most every this many seconds (training.iteration_s)",
    ),
    "collector_backend_device": (
        "stable",
        "str or null",
        "device the collectors' physics backend is bound to; null only when the backend has "
        "no accelerator binding (CPU MuJoCo). Required in a completed manifest (status "
        "completed); equals sim_backend_device for raylab's single-backend collectors",
    ),
    "ring": (
        "stable",
        "object or null",
        "the learner's ring: kind (appo_circular_buffer, sac_device_replay), unit (batches, "
        "transitions), capacity; null where there is none (PPO)",
    ),
    "inference_flight": (
        "stable",
        "object or null",
        "sample requests in flight to the EnvRunners (each runs its own policy inference): "
        "in_flight at the latest report, max_in_flight since the previous report (a window), "
        "limit; null before the first result",
    ),
    "replay_ingress": (
        "stable",
        "object or null",
        "what entered the ring: ingested (cumulative, in the ring's unit), occupancy (size / "
        "capacity at the latest report), high_water_occupancy (cumulative maximum for the run), "
        "ingest_ms_mean (mean time to take one EnvRunner result in; null before the first); "
        "null where there is no ring",
    ),
    "counters": (
        "stable",
        "object",
        "run counters filled in by training (name -> non-negative number): "
        "env_runner_restarts, env_steps_sampled, training_iterations, learner_updates (gradient "
        "updates of all Learners); replay_buffer_size and episode_timeout_rate where they exist",
    ),
    "shutdown": ("experimental", "object or null", "how teardown went, producer-owned"),
    "backend_diagnostics": (
        "experimental",
        "object or null",
        "physics backend runtime snapshot, producer-owned",
    ),
    "experimental": ("experimental", "object", "any other producer-owned diagnostics"),
}
# Stable fields added to v1 after its first runs: optional (validated when present), so the
# manifests of those runs still read; collector_backend_device is required once completed.
OPTIONAL_STABLE_FIELDS = (
    "collector_metric_interval_s",
    "collector_backend_device",
    "ring",
    "inference_flight",
    "replay_ingress",
)
REQUIRED_FIELDS = tuple(
    k for k, v in MANIFEST_FIELDS.items() if v[0] == "stable" and k not in OPTIONAL_STABLE_FIELDS
)
_RING = {"kind": str, "unit": str, "capacity": int}
_FLIGHT = {"in_flight": int, "max_in_flight": int, "limit": int}
_INGRESS = {
    "ingested": int,
    "occupancy": (int, float),
    "high_water_occupancy": (int, float),
    "ingest_ms_mean": (int, float, type(None)),
}

_NODE_FIELDS = {"node_id": str, "node_ip": str, "hostname": str, "alive": bool, "resources": dict}
_ACTOR_REQUIRED = {"index": int, "node_id": str, "device": str}
_ACTOR_OPTIONAL = {
    "kind": str,  # "env_runner" / "learner", must match the list the entry is in
    "pid": (int, type(None)),
    "node_ip": str,
    "hostname": str,
    "accelerator_ids": list,
}
_RUNNER_REQUIRED = {"num_envs": int, "num_threads": int}


def _fail(where: str, message: str) -> MetricSchemaError:
    return MetricSchemaError(f"{where}: {message}")


def _is(value: Any, types) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _check_amounts(d: Any, where: str, what: str) -> None:
    if not isinstance(d, dict):
        raise _fail(where, f"{what} must be an object")
    for k, v in d.items():
        if not isinstance(k, str) or not _is(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _fail(where, f"{what}['{k}'] = {v!r} is not a non-negative finite number")


def _check_actor(
    entry: Any, where: str, kind: str, required: Mapping[str, type], node_ids: set
) -> None:
    if not isinstance(entry, dict):
        raise _fail(where, "must be an object")
    for key, typ in required.items():
        if key not in entry:
            raise _fail(where, f"missing '{key}'")
        if not _is(entry[key], typ):
            raise _fail(where, f"'{key}' must be {typ.__name__}, got {entry[key]!r}")
    for key in entry:
        if key in required:
            continue
        if key not in _ACTOR_OPTIONAL:
            raise _fail(where, f"unknown field '{key}'")
        if not _is(entry[key], _ACTOR_OPTIONAL[key]):
            raise _fail(where, f"bad type for '{key}': {entry[key]!r}")
    if not entry["device"]:
        raise _fail(where, "device must not be empty")
    if "kind" in entry and entry["kind"] != kind:
        raise _fail(where, f"kind {entry['kind']!r} in the {kind} list")
    if entry["node_id"] not in node_ids:
        raise _fail(where, f"node_id {entry['node_id']!r} is not one of the manifest's nodes")


def _check_section(d: Any, key: str, fields: Mapping[str, Any], where: str) -> None:
    """An object-or-null section with exactly ``fields``, numbers non-negative and finite."""
    value = d.get(key)
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != set(fields):
        raise _fail(where, f"{key} must be null or an object with exactly {', '.join(fields)}")
    for name, typ in fields.items():
        v = value[name]
        if not _is(v, typ):
            raise _fail(where, f"{key}.{name} has a bad type: {v!r}")
        if _is(v, (int, float)) and (not math.isfinite(v) or v < 0):
            raise _fail(where, f"{key}.{name} = {v!r} is not a non-negative finite number")


def validate_manifest(d: Any, where: str = "runtime_manifest", completed: bool = False) -> None:
    """Raise :class:`MetricSchemaError` unless ``d`` is a valid runtime manifest v1
    (``completed``: the manifest of a completed run, which must name its
    collector_backend_device)."""
    if not isinstance(d, dict):
        raise _fail(where, f"expected an object, got {type(d).__name__}")
    if "schema_version" not in d:
        raise _fail(where, "missing schema_version")
    version = d["schema_version"]
    if type(version) is not int or version not in SUPPORTED_RUNTIME_MANIFEST_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_RUNTIME_MANIFEST_VERSIONS))
        raise _fail(where, f"unsupported schema_version {version!r}; supported: {supported}")
    for key in REQUIRED_FIELDS:
        if key not in d:
            raise _fail(where, f"missing required field '{key}'")
    unknown = sorted(set(d) - set(MANIFEST_FIELDS))
    if unknown:
        raise _fail(where, f"unknown field '{unknown[0]}'; diagnostics belong under 'experimental'")
    for key in ("ray_version", "raylab_version", "sim_backend"):
        if not isinstance(d[key], str) or not d[key]:
            raise _fail(where, f"{key} must be a non-empty string")
    if d["sim_backend_device"] is not None and (
        not isinstance(d["sim_backend_device"], str) or not d["sim_backend_device"]
    ):
        raise _fail(where, "sim_backend_device must be a device string or null")
    for key in ("envs_per_runner", "threads_per_runner"):
        if not _is(d[key], int) or d[key] < 1:
            raise _fail(where, f"{key} must be a positive int, got {d[key]!r}")
    _check_amounts(d["cluster_resources"], where, "cluster_resources")
    _check_amounts(d["counters"], where, "counters")

    if not isinstance(d["nodes"], list) or not d["nodes"]:
        raise _fail(where, "nodes must be a non-empty list")
    node_ids = set()
    for i, node in enumerate(d["nodes"]):
        w = f"{where}.nodes[{i}]"
        if not isinstance(node, dict) or set(node) != set(_NODE_FIELDS):
            raise _fail(w, f"needs exactly the fields {', '.join(_NODE_FIELDS)}")
        for key, typ in _NODE_FIELDS.items():
            if not _is(node[key], typ):
                raise _fail(w, f"'{key}' must be {typ.__name__}, got {node[key]!r}")
        _check_amounts(node["resources"], w, "resources")
        node_ids.add(node["node_id"])

    for key, kind, required in (
        ("env_runners", "env_runner", {**_ACTOR_REQUIRED, **_RUNNER_REQUIRED}),
        ("learners", "learner", _ACTOR_REQUIRED),
    ):
        if not isinstance(d[key], list):
            raise _fail(where, f"{key} must be a list")
        indices = []
        for i, entry in enumerate(d[key]):
            _check_actor(entry, f"{where}.{key}[{i}]", kind, required, node_ids)
            indices.append(entry["index"])
        if len(set(indices)) != len(indices):
            raise _fail(where, f"{key} has duplicate indices")
    for entry in d["env_runners"]:
        if entry["num_envs"] < 1 or entry["num_threads"] < 1:
            raise _fail(where, "env_runners need num_envs >= 1 and num_threads >= 1")
    for key in ("shutdown", "backend_diagnostics"):
        if key in d and d[key] is not None and not isinstance(d[key], dict):
            raise _fail(where, f"{key} must be an object or null")
    if "experimental" in d and not isinstance(d["experimental"], dict):
        raise _fail(where, "experimental must be an object")

    if completed and "collector_backend_device" not in d:
        raise _fail(where, "a completed manifest needs collector_backend_device (null for CPU)")
    device = d.get("collector_backend_device")
    if device is not None and (not isinstance(device, str) or not device):
        raise _fail(where, "collector_backend_device must be a device string or null")
    interval = d.get("collector_metric_interval_s", 0.0)
    if not _is(interval, (int, float)) or not math.isfinite(interval) or interval < 0:
        raise _fail(where, f"collector_metric_interval_s = {interval!r} is not a number >= 0")
    _check_section(d, "ring", _RING, where)
    if d.get("ring") is not None and d["ring"]["capacity"] < 1:
        raise _fail(where, "ring.capacity must be at least 1")
    _check_section(d, "inference_flight", _FLIGHT, where)
    _check_section(d, "replay_ingress", _INGRESS, where)
    ingress = d.get("replay_ingress")
    if ingress is not None:
        if not ingress["occupancy"] <= ingress["high_water_occupancy"] <= 1.0:
            raise _fail(where, "replay_ingress needs occupancy <= high_water_occupancy <= 1")


def build_manifest(
    *,
    cluster_resources: Mapping[str, float],
    nodes: Sequence[Mapping[str, Any]],
    env_runners: Sequence[Mapping[str, Any]],
    learners: Sequence[Mapping[str, Any]],
    envs_per_runner: int,
    threads_per_runner: int,
    sim_backend: str,
    sim_backend_device: Optional[str] = None,
    counters: Optional[Mapping[str, float]] = None,
    collector_metric_interval_s: float = 0.0,
    collector_backend_device: Optional[str] = None,
    ring: Optional[dict] = None,
    inference_flight: Optional[dict] = None,
    replay_ingress: Optional[dict] = None,
    ray_version: Optional[str] = None,
    raylab_version: Optional[str] = None,
    shutdown: Optional[dict] = None,
    backend_diagnostics: Optional[dict] = None,
    experimental: Optional[dict] = None,
) -> dict:
    """A validated runtime manifest v1 from plain data."""
    if ray_version is None:
        import ray

        ray_version = ray.__version__
    if raylab_version is None:
        from raylab import __version__ as raylab_version
    manifest: Dict[str, Any] = {
        "schema_version": RUNTIME_MANIFEST_SCHEMA_VERSION,
        "ray_version": ray_version,
        "raylab_version": raylab_version,
        "cluster_resources": {k: float(v) for k, v in cluster_resources.items()},
        "nodes": [dict(n) for n in nodes],
        "env_runners": [dict(a) for a in env_runners],
        "learners": [dict(a) for a in learners],
        "envs_per_runner": envs_per_runner,
        "threads_per_runner": threads_per_runner,
        "sim_backend": sim_backend,
        "sim_backend_device": sim_backend_device,
        "counters": dict(counters or {}),
        "collector_metric_interval_s": float(collector_metric_interval_s),
        "collector_backend_device": collector_backend_device,
        "ring": ring,
        "inference_flight": inference_flight,
        "replay_ingress": replay_ingress,
    }
    if shutdown is not None:
        manifest["shutdown"] = shutdown
    if backend_diagnostics is not None:
        manifest["backend_diagnostics"] = backend_diagnostics
    if experimental is not None:
        manifest["experimental"] = experimental
    validate_manifest(manifest)
    return manifest


def collect_cluster_info() -> Dict[str, Any]:
    """``ray_version``, ``cluster_resources`` and ``nodes`` of the connected Ray cluster."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised; call ray.init() first")
    nodes: List[Dict[str, Any]] = []
    for n in ray.nodes():
        nodes.append(
            {
                "node_id": n["NodeID"],
                "node_ip": n.get("NodeManagerAddress", ""),
                "hostname": n.get("NodeManagerHostname", ""),
                "alive": bool(n.get("Alive", False)),
                "resources": {k: float(v) for k, v in (n.get("Resources") or {}).items()},
            }
        )
    return {
        "ray_version": ray.__version__,
        "cluster_resources": {k: float(v) for k, v in ray.cluster_resources().items()},
        "nodes": nodes,
    }


def actor_placement(index: int, device: str, **extra: Any) -> Dict[str, Any]:
    """Call inside an EnvRunner / Learner actor: where it runs (node, pid, host, accelerators).

    ``extra`` adds fields such as ``num_envs`` / ``num_threads`` for EnvRunners.
    """
    import ray

    ctx = ray.get_runtime_context()
    entry: Dict[str, Any] = {
        "index": int(index),
        "node_id": ctx.get_node_id(),
        "device": device,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "accelerator_ids": [str(x) for x in ctx.get_accelerator_ids().get("GPU", [])],
    }
    entry.update(extra)
    return entry
