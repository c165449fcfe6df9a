"""Canonical training metrics as Ray custom metrics, for the Ray dashboard's metrics view.

The Tune callback runs in the driver process; once per training result it hands the validated
canonical metrics to :class:`DashboardExporter`, which sets one ``ray.util.metrics.Gauge`` per
tag, tagged with the run (run directory name) and the trial id. Ray's metrics agent on the
driver's node exposes them in Prometheus format (prefixed ``ray_``); the dashboard's Metrics
tab shows them through Prometheus / Grafana (see cluster/README.md).

What is exported, per result:

- every registered exact tag present (``Train/mean_reward``, ``Perf/total_fps``,
  ``Perf/iteration_time``, ``Perf/env_runner_restarts``, ...) and the members of the ``Loss/``
  and ``Policy/`` families, with the tag's own value and unit;
- the learner phase shares: for each of the algorithm's learner main phases
  (``schema.LEARNER_MAIN_PHASES``) present, phase time / ``Perf/iteration_time`` (both in
  seconds); only when the iteration wall was measured and is positive.

Gauge names come from the canonical tag through :func:`gauge_name` only: ``Perf/total_fps`` ->
``raylab_perf_total_fps``, a share of ``Perf/learning_time`` -> ``raylab_perf_learning_time_share``.
Ray's metric names allow letters, digits and ``_`` (Ray discards any other metric with only a
warning, so a name that breaks the rule raises here instead).
"""

from __future__ import annotations

import math
import re
import threading
from typing import Dict, Mapping, Tuple

from raylab.metrics import schema as S

PREFIX = "raylab_"
SHARE_SUFFIX = "_share"
TAG_KEYS = ("RunName", "TrialId")
EXPORTED_FAMILIES = tuple(S.TAGS[f].family_prefix for f in (S.LOSS_FAMILY, S.POLICY_FAMILY))

_VALID_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_]")


def gauge_name(tag: str, share: bool = False) -> str:
    """The Ray gauge name of a canonical tag (``share``: its share of the learner iteration).

    Raises :class:`~raylab.metrics.schema.MetricSchemaError` for a tag that is not canonical.
    """
    S.spec_of(tag)
    name = PREFIX + _NOT_NAME_CHAR.sub("_", tag).lower() + (SHARE_SUFFIX if share else "")
    if not _VALID_NAME.match(name):  # pragma: no cover - the substitution above guarantees it
        raise S.MetricSchemaError(f"tag '{tag}' gives an invalid Ray metric name '{name}'")
    return name


def _description(tag: str, share: bool) -> str:
    spec = S.spec_of(tag)
    if share:
        return f"{tag} / {S.PERF_ITERATION_TIME}: share of the learner iteration wall [ratio]"
    return f"{tag} [{S.UNITS[spec.unit]}]: {spec.description}"


def exported_values(metrics: Mapping[str, float], algo: str) -> Dict[Tuple[str, bool], float]:
    """(tag, is_share) -> value for one result: what :meth:`DashboardExporter.export` sets."""
    if algo not in S.LEARNER_MAIN_PHASES:
        raise S.MetricSchemaError(
            f"unknown algorithm {algo!r}; valid choices: {', '.join(S.LEARNER_MAIN_PHASES)}"
        )
    out: Dict[Tuple[str, bool], float] = {}
    for tag, value in S.normalize(metrics).items():
        spec = S.spec_of(tag)
        if spec.is_family and not tag.startswith(EXPORTED_FAMILIES):
            continue
        if math.isfinite(value):
            out[(tag, False)] = value
    wall = metrics.get(S.PERF_ITERATION_TIME)
    if wall is not None and math.isfinite(wall) and wall > 0:
        for phase in S.LEARNER_MAIN_PHASES[algo]:
            if phase in metrics and math.isfinite(metrics[phase]):
                out[(phase, True)] = S.to_seconds(phase, metrics[phase]) / float(wall)
    return out


class DashboardExporter:
    """Sets the Ray gauges of one trial. Gauges are shared by all trials of the process.

    Without a connected Ray (``ray.is_initialized()`` false) nothing is set, but
    :meth:`export` still returns what it would have set.
    """

    _gauges: Dict[str, object] = {}
    _tag_of_name: Dict[str, str] = {}
    _lock = threading.Lock()
    _exporters: Dict[Tuple[str, str], "DashboardExporter"] = {}

    def __init__(self, run_name: str, trial_id: str):
        if not run_name or not trial_id:
            raise ValueError("DashboardExporter needs a run_name and a trial_id")
        self.run_name = str(run_name)
        self.trial_id = str(trial_id)
        self.tags = {TAG_KEYS[0]: self.run_name, TAG_KEYS[1]: self.trial_id}

    @classmethod
    def get(cls, run_name: str, trial_id: str) -> "DashboardExporter":
        """The exporter of one trial, created on first use."""
        key = (str(run_name), str(trial_id))
        with cls._lock:
            exporter = cls._exporters.get(key)
            if exporter is None:
                exporter = cls._exporters[key] = cls(run_name, trial_id)
        return exporter

    @classmethod
    def _gauge(cls, tag: str, share: bool):
        from ray.util.metrics import Gauge

        name = gauge_name(tag, share)
        with cls._lock:
            owner = cls._tag_of_name.setdefault(name, f"{tag}{'#share' if share else ''}")
            if owner != f"{tag}{'#share' if share else ''}":
                return None  # two family terms that differ only in '.' / '-': keep the first
            gauge = cls._gauges.get(name)
            if gauge is None:
                gauge = cls._gauges[name] = Gauge(
                    name, description=_description(tag, share), tag_keys=TAG_KEYS
                )
        return gauge

    def export(self, metrics: Dict[str, float], algo: str) -> Dict[str, float]:
        """Set the gauges for one result; return {gauge name: value set}."""
        import ray

        live = ray.is_initialized()
        out: Dict[str, float] = {}
        for (tag, share), value in exported_values(metrics, algo).items():
            if live:
                gauge = self._gauge(tag, share)
                if gauge is None:
                    continue
                gauge.set(value, tags=self.tags)
            out[gauge_name(tag, share)] = value
        return out


_warned: set = set()
_algo_of_run: Dict[str, str] = {}


def _algo_of(run_dir) -> str:
    """The algorithm of a run directory (its run_config.json), read once per directory."""
    from pathlib import Path

    from raylab.metrics.rundir import RunDirectory

    key = str(run_dir)
    if key not in _algo_of_run:
        _algo_of_run[key] = str(RunDirectory(Path(run_dir)).read_config()["algo"]["name"])
    return _algo_of_run[key]


def export_result(run_dir, trial_id: str, metrics: Dict[str, float]) -> Dict[str, float]:
    """One call for the Tune callback: set the trial's gauges; never raises.

    ``run_dir`` is the trial's run directory: its name is the ``RunName`` tag and its
    run_config.json says the algorithm (whose learner main phases give the shares). A failure
    is reported once per trial on stderr and training goes on (the dashboard is a view).
    """
    from pathlib import Path

    run_name = Path(run_dir).name
    try:
        return DashboardExporter.get(run_name, trial_id).export(metrics, _algo_of(run_dir))
    except Exception as e:
        if (run_name, trial_id) not in _warned:
            _warned.add((run_name, trial_id))
            import sys

            print(f"raylab: dashboard metrics not exported: {e}", file=sys.stderr, flush=True)
        return {}


# ------------------------------------------------------------------------------- Grafana board

GRAFANA_FILE = "cluster/grafana/raylab.json"
_RUN_VAR = "run"


def _series(tag: str, share: bool = False) -> dict:
    """One Prometheus target: the gauge of ``tag`` for the runs picked on the board."""
    spec = S.spec_of(tag)
    member = tag[len(spec.family_prefix) :] if spec.is_family else ""
    label = dict(spec.member_labels).get(member) or spec.label or tag
    return {
        "expr": f'ray_{gauge_name(tag, share)}{{RunName=~"${_RUN_VAR}"}}',
        "legendFormat": f"{label}{' share' if share else ''} {{{{RunName}}}} {{{{TrialId}}}}",
        "refId": "",
    }


def _panel(title: str, unit: str, targets: list, stacked: bool = False) -> dict:
    for i, target in enumerate(targets):
        target["refId"] = chr(ord("A") + i) if i < 26 else f"T{i}"
    return {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"stacking": {"mode": "normal" if stacked else "none"}},
            },
            "overrides": [],
        },
        "targets": targets,
    }


def grafana_board() -> dict:
    """Grafana dashboard JSON for the gauges raylab exports, built from the metric schema (so
    it names no gauge that does not exist): throughput, the learner phases as shares of the
    iteration (every algorithm's phases), losses and policy statistics (the families' known
    members), rewards and evaluation, and run health. One row of series per run and trial;
    the ``run`` variable picks runs by RunName."""
    phases = []
    for algo_phases in S.LEARNER_MAIN_PHASES.values():
        phases += [p for p in algo_phases if p not in phases]
    loss, policy = (S.TAGS[f] for f in (S.LOSS_FAMILY, S.POLICY_FAMILY))
    panels = [
        _panel(
            "Throughput",
            "short",
            [_series(t) for t in (S.PERF_TOTAL_FPS, S.PERF_LEARNER_UPDATES_PER_S)],
        ),
        _panel(
            "Learner phases (share of the iteration wall)",
            "percentunit",
            [_series(p, share=True) for p in phases],
            stacked=True,
        ),
        _panel("Iteration wall", "s", [_series(S.PERF_ITERATION_TIME)]),
        _panel(
            "Losses",
            "none",
            [_series(loss.family_prefix + m) for m, _ in loss.member_labels],
        ),
        _panel(
            "Policy statistics",
            "none",
            [_series(policy.family_prefix + m) for m, _ in policy.member_labels],
        ),
        _panel(
            "Rewards",
            "none",
            [_series(t) for t in (S.TRAIN_MEAN_REWARD, S.EVAL_MEAN_REWARD)],
        ),
        _panel(
            "Episode length and survival",
            "none",
            [
                _series(t)
                for t in (S.TRAIN_MEAN_EPISODE_LENGTH, S.EVAL_MEAN_EPISODE_LENGTH, S.EVAL_SURVIVAL)
            ],
        ),
        _panel(
            "Health",
            "none",
            [_series(t) for t in (S.PERF_ENV_RUNNER_RESTARTS, S.PERF_POLICY_STALENESS)],
        ),
    ]
    for i, panel in enumerate(panels):
        panel["id"] = i + 1
        panel["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    first = f"ray_{gauge_name(S.PERF_TOTAL_FPS)}"
    return {
        "title": "raylab training",
        "uid": "raylab-training",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "tags": ["raylab", "ray"],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                },
                {
                    "name": _RUN_VAR,
                    "type": "query",
                    "label": "run",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({first}, RunName)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels,
    }


def main(argv=None) -> int:
    """``python -m raylab.dashboard grafana [OUT]``: write the Grafana board (default: stdout)."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m raylab.dashboard", description=main.__doc__)
    p.add_argument("what", choices=["grafana"])
    p.add_argument("out", nargs="?", help=f"file to write (the repository's: {GRAFANA_FILE})")
    args = p.parse_args(argv)
    text = json.dumps(grafana_board(), indent=2) + "\n"
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
