"""What a run asks the Ray cluster for, held against what the cluster has, before anything waits.

Tune starts a trial only when its placement group (one bundle for the algorithm's main process,
one per EnvRunner, one per Learner: RLlib's ``Algorithm.default_resource_request``) is
reserved. A request the cluster can never grant would leave the trial pending forever with no
message, so before the Tuner starts raylab:

1. takes the bundles from the algorithm's own ``default_resource_request`` (what Tune will ask);
2. fits them onto the alive nodes' total resources (first fit, largest bundle first: the
   strategy is PACK, which may spread bundles over nodes);
3. if they do not fit and nothing can add nodes (a bare ``ray start --head``): one line naming
   what the run needs, what the cluster has and overrides that would fit (``InfeasibleRequest``,
   exit code 2), within seconds;
4. otherwise reserves the same bundles itself and waits for them: at once when the cluster is
   free, else with a line every ``PROGRESS_S`` saying what it waits for (busy nodes, or nodes an
   autoscaler is adding), and after ``resources.wait_s`` the same one-line failure. The probe
   group is removed before the Tuner asks for its own.

Whether an autoscaler can add nodes, and of which shapes, is read from what the autoscaler
publishes in the GCS (:func:`autoscaler_node_types`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from raylab.errors import UserError

Bundle = Dict[str, float]
PROGRESS_S = 30.0  # a waiting line this often


class InfeasibleRequest(UserError):
    """The cluster cannot grant the run's placement group (now, or within resources.wait_s)."""


def _say(msg: str) -> None:
    print(f"raylab: {msg}", file=sys.stderr, flush=True)


def requested_bundles(trainable, algo_config) -> Tuple[List[Bundle], str]:
    """The non-empty bundles and the strategy Tune will request for one trial."""
    pgf = trainable.default_resource_request(algo_config)
    bundles = [{k: float(v) for k, v in b.items() if v} for b in pgf.bundles if any(b.values())]
    return bundles, pgf.strategy


def fits(bundles: Sequence[Bundle], nodes: Sequence[Bundle]) -> bool:
    """Whether every bundle finds a node with room (first fit, largest CPU bundle first)."""
    free = [dict(n) for n in nodes]
    for b in sorted(bundles, key=lambda b: (-b.get("GPU", 0.0), -b.get("CPU", 0.0))):
        for node in free:
            if all(node.get(k, 0.0) >= v - 1e-9 for k, v in b.items()):
                for k, v in b.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            return False
    return True


def node_totals() -> List[Bundle]:
    """Total resources of each alive node (logical CPU, GPU, memory, custom)."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


READONLY_NODE_TYPE = re.compile(r"^node_[0-9a-f]+$")  # Ray's name for a node no config made


def autoscaler_node_types() -> Optional[List[Tuple[Bundle, int]]]:
    """What an autoscaler may add: (resources, max count) per node type; ``[]`` when no
    autoscaler can add nodes (a bare ``ray start --head``); ``None`` when one can but its node
    types are not published.

    Ray 2.60 has no public call for this. The autoscaler v2 and KubeRay publish their node
    groups as the cluster config in the GCS (Ray Train's resource check reads it the same way);
    the v1 monitor publishes only a status report, in which a cluster without an autoscaling
    config lists each node under Ray's anonymous type ``node_<id>``.
    """
    from raylab.algorithms.rllib_compat import gcs_cluster_config, internal_kv_get

    try:
        config = gcs_cluster_config()
    except Exception:  # an older GCS or no access: fall through to the status report
        config = None
    if config is not None and config.node_group_configs:
        return [
            (
                {k: float(v) for k, v in g.resources.items()},
                g.max_count if g.max_count >= 0 else 1000,
            )
            for g in config.node_group_configs
            if g.max_count != 0
        ]
    try:
        raw = internal_kv_get(AUTOSCALING_STATUS_KEY)
    except Exception:
        raw = None
    return None if status_has_autoscaling_config(raw) else []


AUTOSCALING_STATUS_KEY = "__autoscaling_status"  # ray_constants.DEBUG_AUTOSCALING_STATUS


def status_has_autoscaling_config(raw: Optional[bytes]) -> bool:
    """Whether a v1 monitor status report comes from an autoscaler with node types of its own
    (not the read-only monitor of a manually started cluster)."""
    if not raw:
        return False
    try:
        report = json.loads(raw).get("autoscaler_report") or {}
    except (ValueError, AttributeError):
        return False
    names = set(report.get("active_nodes") or {}) | set(report.get("idle_nodes") or {})
    names |= {p[1] for p in report.get("pending_nodes") or [] if len(p) > 1}
    names |= set(report.get("pending_launches") or {})
    return any(not READONLY_NODE_TYPE.match(str(n)) for n in names)


def _total(bundles: Sequence[Bundle]) -> Bundle:
    out: Bundle = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fmt(res: Bundle) -> str:
    shown = {k: v for k, v in res.items() if k in ("CPU", "GPU") or not _is_builtin(k)}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items()) if v) or "nothing"


def _is_builtin(key: str) -> bool:
    return key in ("memory", "object_store_memory") or key.startswith("node:")


def describe_need(bundles: Sequence[Bundle]) -> str:
    parts = {}
    for b in bundles:
        key = "{" + _fmt(b) + "}"
        parts[key] = parts.get(key, 0) + 1
    each = " + ".join(f"{n} x {k}" if n > 1 else k for k, n in parts.items())
    return f"{_fmt(_total(bundles))} ({each})"


def describe_cluster(nodes: Sequence[Bundle]) -> str:
    per = "; ".join(_fmt(n) for n in nodes)
    return f"{_fmt(_total(nodes))} on {len(nodes)} node(s) [{per}]"


def alternatives(trainable, algo_config, cfg, nodes: Sequence[Bundle]) -> List[str]:
    """Overrides of resources.* (one set each) whose bundles fit these nodes."""
    r = cfg.resources
    candidates: List[Dict[str, float]] = []
    for n in range(int(r.num_env_runners) - 1, 0, -1):
        candidates.append({"num_env_runners": n})
    for frac in (1.0, 0.5, 0.25):
        if r.num_cpus_per_env_runner > frac:
            candidates.append({"num_cpus_per_env_runner": frac})
        if r.num_learners > 0 and r.num_cpus_per_learner > frac:
            candidates.append({"num_cpus_per_learner": frac})
        if r.num_cpus_per_env_runner > frac and r.num_learners > 0:
            candidates.append({"num_cpus_per_env_runner": frac, "num_cpus_per_learner": frac})
    if r.num_learners > 0:
        candidates.append({"num_learners": 0})
    out = []
    for cand in candidates:
        bundles, _ = requested_bundles(trainable, _with(algo_config, cand))
        if fits(bundles, nodes):
            out.append(" ".join(f"resources.{k}={v:g}" for k, v in cand.items()))
        if len(out) == 3:
            break
    return out


def _with(algo_config, overrides: Dict[str, float]):
    """A copy of the AlgorithmConfig with raylab's resources.* overrides applied."""
    c = algo_config.copy(copy_frozen=False)
    if "num_env_runners" in overrides:
        c.env_runners(num_env_runners=int(overrides["num_env_runners"]))
    if "num_cpus_per_env_runner" in overrides:
        c.env_runners(num_cpus_per_env_runner=overrides["num_cpus_per_env_runner"])
    if "num_cpus_per_learner" in overrides:
        c.learners(num_cpus_per_learner=overrides["num_cpus_per_learner"])
    if "num_learners" in overrides:
        c.learners(num_learners=int(overrides["num_learners"]))
    return c


def check_resources(
    cfg,
    trainable,
    algo_config,
    wait_s: Optional[float] = None,
    say: Callable[[str], None] = _say,
) -> None:
    """Return once the cluster can start this run; raise ``InfeasibleRequest`` (one line) if it
    cannot now and no autoscaler can make it, or if it still cannot after ``wait_s`` seconds."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    wait_s = float(cfg.resources.wait_s if wait_s is None else wait_s)
    bundles, strategy = requested_bundles(trainable, algo_config)
    if not bundles:
        return
    nodes = node_totals()
    need, have = describe_need(bundles), describe_cluster(nodes)

    def failure(why: str) -> InfeasibleRequest:
        alts = alternatives(trainable, algo_config, cfg, nodes)
        fix = f"; overrides that fit: {' | '.join(alts)}" if alts else ""
        return InfeasibleRequest(f"this run needs {need}; the Ray cluster has {have}: {why}{fix}")

    scaling = ""
    if not fits(bundles, nodes):
        types = autoscaler_node_types()
        if types == []:
            raise failure("it does not fit and no autoscaler can add nodes")
        if types is not None:
            addable = [res for res, count in types for _ in range(min(count, len(bundles)))]
            if not fits(bundles, list(nodes) + addable):
                raise failure("it does not fit even with every node the autoscaler may add")
        scaling = " (from nodes the autoscaler adds)"

    pg = placement_group(bundles, strategy=strategy, name="raylab-resource-check")
    try:
        start = time.monotonic()
        ready = pg.wait(timeout_seconds=min(2.0, wait_s))
        while not ready:
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise failure(
                    f"not granted within resources.wait_s={wait_s:g} s{scaling}; the cluster "
                    f"has {_fmt(ray.available_resources())} free"
                )
            say(
                f"waiting for the Ray cluster to grant {need}{scaling}: "
                f"{_fmt(ray.available_resources())} free now; {waited:.0f} s of "
                f"resources.wait_s={wait_s:g} s"
            )
            ready = pg.wait(timeout_seconds=min(PROGRESS_S, max(0.1, wait_s - waited)))
    finally:
        remove_placement_group(pg)
