"""Fail-closed reader: a run's TensorBoard event files -> a table of canonical metrics.

Default mode reads runs stamped with a supported ``metric_schema_version`` in
``run_summary.json`` and accepts only canonical, persisted tags. It fails with one line when the
stamp is missing or unsupported, a tag is unknown, retired or has a wrong unit suffix, a
terminal-only tag was persisted, a value is NaN / inf where the tag forbids it, or canonical and
legacy tags are mixed.

``legacy_unversioned=True`` is the only way to read pre-schema runs: every tag must be a
recognised legacy tag, and no canonical tag and no schema stamp may be present. Legacy tags are
migrated to canonical ones with their unit conversion; retired tags without a replacement are
dropped. It is not a fallback for new runs that lack a stamp.

Event files are read with TensorBoard's own ``EventAccumulator``. A raylab run contains only
scalar summaries; any other summary kind fails closed. When one tag has several values for a
step (a resumed run re-logging steps), the latest by wall time wins.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, TextIO, Tuple, Union

from raylab.metrics import schema
from raylab.metrics.rundir import CONFIG_FILE, SUMMARY_FILE, read_summary
from raylab.metrics.schema import MetricSchemaError

EVENT_GLOB = "events.out.tfevents.*"
_NON_SCALAR_KINDS = ("images", "audio", "histograms", "distributions", "tensors")


@dataclass
class MetricTable:
    """Canonical metrics of one run: ``values[tag][step] = value``."""

    run_dir: Path
    schema_version: int
    legacy_unversioned: bool
    values: Dict[str, Dict[int, float]]
    wall_time: Dict[int, float] = field(default_factory=dict)
    dropped: Tuple[str, ...] = ()  # retired legacy tags without a replacement

    @property
    def tags(self) -> List[str]:
        return sorted(self.values)

    @property
    def steps(self) -> List[int]:
        return sorted({s for col in self.values.values() for s in col})

    def column(self, tag: str) -> List[Tuple[int, float]]:
        """(step, value) pairs of one tag, by step."""
        return sorted(self.values[tag].items())

    def rows(self) -> Iterator[Dict[str, Optional[float]]]:
        """One dict per step: ``step``, ``wall_time`` and every tag (None where absent)."""
        tags = self.tags
        for step in self.steps:
            row: Dict[str, Optional[float]] = {"step": step, "wall_time": self.wall_time.get(step)}
            for tag in tags:
                row[tag] = self.values[tag].get(step)
            yield row

    def to_csv(self, out: Union[str, os.PathLike, TextIO]) -> None:
        """Write ``step,wall_time,<tags...>``; empty cells where a tag has no value."""
        if isinstance(out, (str, os.PathLike)):
            with open(out, "w", newline="", encoding="utf-8") as f:
                self.to_csv(f)
            return
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["step", "wall_time", *self.tags])
        for row in self.rows():
            writer.writerow(["" if v is None else repr(v) for v in row.values()])

    def to_csv_string(self) -> str:
        buf = io.StringIO()
        self.to_csv(buf)
        return buf.getvalue()

    def to_arrow(self):
        """The table as a ``pyarrow.Table`` (nulls where a tag has no value)."""
        import pyarrow as pa

        rows = list(self.rows())
        columns = {"step": pa.array([r["step"] for r in rows], pa.int64())}
        columns["wall_time"] = pa.array([r["wall_time"] for r in rows], pa.float64())
        for tag in self.tags:
            columns[tag] = pa.array([r[tag] for r in rows], pa.float64())
        meta = {
            "metric_schema_version": str(self.schema_version),
            "legacy_unversioned": str(self.legacy_unversioned).lower(),
        }
        return pa.table(columns).replace_schema_metadata(meta)


def _read_event_files(run_dir: Path) -> Dict[str, Dict[int, Tuple[float, float]]]:
    """tag -> step -> (wall_time, value) over every event file under ``run_dir``."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    files = sorted(p for p in run_dir.rglob(EVENT_GLOB) if p.is_file())
    if not files:
        raise MetricSchemaError(f"no TensorBoard event files ({EVENT_GLOB}) under {run_dir}")
    out: Dict[str, Dict[int, Tuple[float, float]]] = {}
    guidance = {
        ea.SCALARS: 0,
        ea.TENSORS: 0,
        ea.IMAGES: 1,
        ea.AUDIO: 1,
        ea.HISTOGRAMS: 1,
        ea.COMPRESSED_HISTOGRAMS: 1,
    }
    for path in files:
        acc = ea.EventAccumulator(str(path), size_guidance=guidance)
        try:
            acc.Reload()
        except Exception as e:  # a corrupt file: fail closed with one line
            raise MetricSchemaError(f"cannot read event file {path}: {e}") from None
        tags = acc.Tags()
        for kind in _NON_SCALAR_KINDS:
            if tags.get(kind):
                raise MetricSchemaError(
                    f"{path.name}: non-scalar {kind} summary '{tags[kind][0]}' is not a "
                    "raylab metric"
                )
        for tag in tags.get("scalars", []):
            col = out.setdefault(tag, {})
            for ev in acc.Scalars(tag):
                old = col.get(ev.step)
                if old is None or ev.wall_time >= old[0]:
                    col[ev.step] = (ev.wall_time, float(ev.value))
    return out


def _table(run_dir: Path, version: int, legacy: bool, cols, dropped=()) -> MetricTable:
    values: Dict[str, Dict[int, float]] = {}
    wall: Dict[int, float] = {}
    for tag, col in cols.items():
        values[tag] = {}
        for step, (t, v) in col.items():
            values[tag][step] = v
            wall[step] = max(wall.get(step, t), t)
    return MetricTable(run_dir, version, legacy, values, wall, tuple(sorted(dropped)))


def _check_canonical(run_dir: Path, raw) -> None:
    legacy = sorted(t for t in raw if schema.is_legacy(t))
    canonical = sorted(t for t in raw if schema.is_canonical(t))
    if legacy and canonical:
        raise MetricSchemaError(
            f"{run_dir}: mixed canonical and legacy tags ('{canonical[0]}' and legacy "
            f"'{legacy[0]}'); refusing to guess"
        )
    for tag in sorted(raw):
        spec = schema.spec_of(tag)  # unknown / wrong unit / retired -> MetricSchemaError
        if not spec.persisted:
            raise MetricSchemaError(f"{run_dir}: terminal-only tag '{tag}' must not be persisted")
        if not spec.allow_nonfinite:
            for step, (_, value) in raw[tag].items():
                if not math.isfinite(value):
                    raise MetricSchemaError(
                        f"{run_dir}: '{tag}' is {value} at step {step}; it must be finite"
                    )


def _legacy_algorithm(run_dir: Path) -> Optional[str]:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise MetricSchemaError(f"{path}: not valid JSON") from None
    algo = cfg.get("algo") if isinstance(cfg, dict) else None
    if isinstance(algo, dict):
        algo = algo.get("name")
    return algo if isinstance(algo, str) else None


def _migrate(run_dir: Path, raw) -> Tuple[dict, List[str]]:
    canonical = sorted(t for t in raw if schema.is_canonical(t))
    if canonical:
        raise MetricSchemaError(
            f"{run_dir}: canonical tag '{canonical[0]}' present; --legacy-unversioned reads only "
            "pre-schema runs"
        )
    unknown = sorted(t for t in raw if not schema.is_legacy(t))
    if unknown:
        raise MetricSchemaError(
            f"{run_dir}: '{unknown[0]}' is neither a canonical nor a recognised legacy tag"
        )
    needs_algorithm = any(
        not isinstance(schema.LEGACY_MIGRATION[t].canonical, str)
        for t in raw
        if t in schema.LEGACY_MIGRATION
    )
    algorithm = _legacy_algorithm(run_dir) if needs_algorithm else None
    chosen: Dict[str, Tuple[int, str, float]] = {}  # canonical -> (rank, old tag, factor)
    dropped: List[str] = []
    for old in sorted(raw):
        if old not in schema.LEGACY_MIGRATION:
            dropped.append(old)  # retired without a replacement
            continue
        rule = schema.LEGACY_MIGRATION[old]
        if not isinstance(rule.canonical, str) and algorithm not in rule.canonical:
            raise MetricSchemaError(
                f"{run_dir}: legacy tag '{old}' maps per algorithm "
                f"({', '.join(sorted(rule.canonical))}) and {CONFIG_FILE} names algorithm "
                f"{algorithm!r}"
            )
        tag, factor = schema.migrate_legacy(old, algorithm)
        rank = schema.LEGACY_MIGRATION[old].rank
        if tag in chosen and chosen[tag][0] == rank:
            raise MetricSchemaError(
                f"{run_dir}: legacy tags '{chosen[tag][1]}' and '{old}' both map to '{tag}'"
            )
        if tag not in chosen or rank < chosen[tag][0]:
            chosen[tag] = (rank, old, factor)
    cols = {
        tag: {s: (t, v * factor) for s, (t, v) in raw[old].items()}
        for tag, (_, old, factor) in chosen.items()
    }
    return cols, dropped


def extract(run_dir: Union[str, os.PathLike], legacy_unversioned: bool = False) -> MetricTable:
    """Read one run's metrics into a :class:`MetricTable` (fails closed, see the module doc)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MetricSchemaError(f"run directory {run_dir} does not exist")
    if not legacy_unversioned:
        summary = read_summary(run_dir)
        raw = _read_event_files(run_dir)
        _check_canonical(run_dir, raw)
        return _table(run_dir, summary["metric_schema_version"], False, raw)

    summary_path = run_dir / SUMMARY_FILE
    if summary_path.is_file():
        try:
            stamped = "metric_schema_version" in json.loads(summary_path.read_text("utf-8"))
        except (json.JSONDecodeError, TypeError):
            raise MetricSchemaError(f"{summary_path}: not valid JSON") from None
        if stamped:
            raise MetricSchemaError(
                f"{summary_path} has a metric_schema_version stamp; --legacy-unversioned reads "
                "only pre-schema runs (drop the flag)"
            )
    raw = _read_event_files(run_dir)
    cols, dropped = _migrate(run_dir, raw)
    return _table(run_dir, schema.METRIC_SCHEMA_VERSION, True, cols, dropped)
