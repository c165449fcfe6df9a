"""Run directories and their JSON files.

A run directory holds everything one training run writes: ``run_config.json`` (the composed
config, secrets redacted), ``run_summary.json`` (metric schema version, runtime manifest, final
metrics, status and times), the TensorBoard event files (and ``wandb/`` with W&B),
``checkpoints/`` and ``play_video.mp4`` when one was rendered.

Where it goes (:func:`resolve_run_dir`):

- default ``logs/<algo.algo_log_name>/<task>/<YYYY-MM-DD_HH-MM-SS>_<sim>/`` under the current
  directory;
- ``training.log_root=DIR`` replaces ``logs/<algo_log_name>/<task>``;
- ``training.log_dir=DIR`` is the exact directory, which must not exist yet.

An existing run directory is never reused: a timestamped name that is taken gets a ``_1``,
``_2``, ... suffix, and an existing ``training.log_dir`` is a ``UserError``. The directory is
claimed with an exclusive ``mkdir``, so two runs started in the same second cannot share it.

JSON files are written atomically (temporary file in the same folder, fsync, rename), so a
crash at any moment leaves the previous complete version.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from raylab.errors import UserError
from raylab.metrics import schema
from raylab.metrics.schema import MetricSchemaError

CONFIG_FILE = "run_config.json"
SUMMARY_FILE = "run_summary.json"
CHECKPOINT_DIR = "checkpoints"
VIDEO_FILE = "play_video.mp4"
EPISODES_FILE = "episodes.csv"  # training.episode_log: one row per finished episode

STATUSES = ("running", "completed", "failed", "interrupted")
REDACTED = "<redacted>"
SECRET_KEY_PARTS = ("api_key", "apikey", "token", "secret", "password")

# Optional top-level run_summary.json fields and their JSON types. Anything else is rejected;
# producer-owned extras go under "experimental".
SUMMARY_REQUIRED = {
    "metric_schema_version": "int",
    "status": "str",
    "start_time": "str",
    "end_time": "str or null",
    "runtime_manifest": "object or null",
    "final_metrics": "object",
}
SUMMARY_OPTIONAL = {
    "algo": (str,),
    "task": (str,),
    "sim": (str,),
    "trial_id": (str,),
    "env_steps": (int,),
    "training_iteration": (int,),
    "time_total_s": (int, float),
    "last_checkpoint": (str, type(None)),
    "restored_from": (list,),
    "best_eval": (dict, type(None)),
    "initial_eval": (dict, type(None)),
    "error": (str, type(None)),
    # interrupted runs: external_cancellation (SIGTERM: ray job stop, a scheduler),
    # user_interrupt (Ctrl-C: stopped after its iteration, final checkpoint written) or
    # user_abort (a second Ctrl-C: ended at once, the last periodic checkpoint stands)
    "stop_reason": (str, type(None)),
    "backend_diagnostics": (dict, type(None)),
    "experimental": (dict,),
}

PathLike = Union[str, os.PathLike]


# ------------------------------------------------------------------------- atomic JSON


def write_json_atomic(path: PathLike, obj: Any) -> Path:
    """Write ``obj`` as JSON to ``path`` via temp file + fsync + rename; return the path.

    The object is serialised before anything touches the disk; on any failure the temp file is
    removed and the previous file (if any) is left as it was. NaN / inf are refused (not JSON).
    """
    path = Path(path)
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------- run directory path


def cfg_select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg.a.b`` for an OmegaConf config, a nested dict or nested attributes."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.select(cfg, dotted, default=default)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return default
            node = node[part]
        else:
            if not hasattr(node, part):
                return default
            node = getattr(node, part)
    return node


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def _safe_name(text: str) -> str:
    """A path component: Gymnasium ids such as ``ns/Env-v0`` become ``ns_Env-v0``."""
    return _UNSAFE.sub("_", str(text)).strip("._") or "_"


def resolve_run_dir(cfg: Any, now: Optional[datetime] = None, create: bool = True) -> Path:
    """The absolute run directory for a composed config (rules: see the module docstring).

    With ``create`` (the default) the directory is created and thereby claimed; a clash with an
    existing directory gets the next free ``_N`` suffix. ``training.log_dir`` that already exists
    raises :class:`UserError`.
    """
    log_dir = cfg_select(cfg, "training.log_dir")
    for key in ("training.log_dir", "training.log_root"):
        value = cfg_select(cfg, key)
        if value and "://" in str(value):
            raise UserError(
                f"{key}={value}: cloud storage URIs are not supported yet; use a shared "
                "filesystem path mounted at the same place on every node"
            )
    if log_dir:
        path = Path(str(log_dir)).expanduser().absolute()
        if path.exists():
            raise UserError(
                f"training.log_dir={log_dir} already exists; raylab never overwrites a run: "
                "choose a new directory, or drop training.log_dir to get a timestamped one"
            )
        if create:
            _mkdir(path, exist_ok=False, what=f"training.log_dir={log_dir}")
        return path

    log_root = cfg_select(cfg, "training.log_root")
    if log_root:
        base = Path(str(log_root)).expanduser().absolute()
    else:
        algo_log_name = cfg_select(cfg, "algo.algo_log_name")
        task = cfg_select(cfg, "task")
        if not algo_log_name or not task:
            raise UserError("config has no algo.algo_log_name / task to name the run directory")
        base = Path("logs").absolute() / _safe_name(algo_log_name) / _safe_name(task)
    sim = cfg_select(cfg, "sim") or "none"
    stamp = (now or datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    name = f"{stamp}_{_safe_name(sim)}"
    if create:
        _mkdir(base, exist_ok=True, what=str(base))
    for n in range(0, 10_000):
        path = base / (name if n == 0 else f"{name}_{n}")
        if path.exists():
            continue
        if not create:
            return path
        try:
            path.mkdir()
            return path
        except FileExistsError:  # another run claimed it between exists() and mkdir()
            continue
    raise UserError(f"too many run directories named {name}* in {base}")


def _mkdir(path: Path, exist_ok: bool, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        raise UserError(f"{what} already exists; raylab never overwrites a run") from None
    except OSError as e:
        raise UserError(f"cannot create run directory {path}: {e.strerror}") from None


# ------------------------------------------------------------------------- config and summary


def redact(obj: Any) -> Any:
    """A copy with the value of every key containing api_key / token / secret / password hidden."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            secret = isinstance(k, str) and any(p in k.lower() for p in SECRET_KEY_PARTS)
            out[k] = REDACTED if secret and v is not None else redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def config_to_dict(config: Any) -> dict:
    """A plain, resolved dict of an OmegaConf config (or a copy of a mapping)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(config):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config), default=str))
    raise TypeError(f"config must be an OmegaConf config or a mapping, not {type(config).__name__}")


def now_iso() -> str:
    """The current local time, ISO 8601 with its UTC offset, to the second."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


def as_iso_time(value: Any) -> Optional[str]:
    """An ISO 8601 string from an ISO string, a ``datetime`` or epoch seconds (None stays None)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.astimezone()
        return moment.isoformat(timespec="seconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    raise MetricSchemaError(f"{value!r} is not a time (ISO string, datetime or epoch seconds)")


def _final_metrics_json(metrics: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    clean = schema.normalize({k: (math.nan if v is None else v) for k, v in metrics.items()})
    # NaN / inf (allowed only for losses and policy stats) are not JSON: stored as null.
    return {k: (v if math.isfinite(v) else None) for k, v in sorted(clean.items())}


def validate_summary(summary: Any, where: str = SUMMARY_FILE) -> None:
    """Raise :class:`MetricSchemaError` unless ``summary`` is a valid run_summary.json object."""
    if not isinstance(summary, dict):
        raise MetricSchemaError(f"{where}: expected a JSON object, got {type(summary).__name__}")
    if "metric_schema_version" not in summary:
        raise MetricSchemaError(
            f"{where}: missing metric_schema_version (a pre-schema run? only "
            "`raylab metrics extract --legacy-unversioned` reads those)"
        )
    version = summary["metric_schema_version"]
    if type(version) is not int or version not in schema.SUPPORTED_METRIC_SCHEMA_VERSIONS:
        supported = ", ".join(map(str, schema.SUPPORTED_METRIC_SCHEMA_VERSIONS))
        raise MetricSchemaError(
            f"{where}: unsupported metric_schema_version {version!r}; supported: {supported}"
        )
    for key in SUMMARY_REQUIRED:
        if key not in summary:
            raise MetricSchemaError(f"{where}: missing required field '{key}'")
    unknown = sorted(set(summary) - set(SUMMARY_REQUIRED) - set(SUMMARY_OPTIONAL))
    if unknown:
        raise MetricSchemaError(
            f"{where}: unknown field '{unknown[0]}'; producer extras belong under 'experimental'"
        )
    status = summary["status"]
    if status not in STATUSES:
        raise MetricSchemaError(
            f"{where}: bad status {status!r}; valid choices: {', '.join(STATUSES)}"
        )
    _check_time(summary["start_time"], "start_time", where, nullable=False)
    _check_time(summary["end_time"], "end_time", where, nullable=True)
    if status != "running" and summary["end_time"] is None:
        raise MetricSchemaError(f"{where}: status '{status}' needs an end_time")
    manifest = summary["runtime_manifest"]
    if manifest is not None:
        from raylab.metrics.manifest import validate_manifest

        validate_manifest(
            manifest, where=f"{where}: runtime_manifest", completed=status == "completed"
        )
    final = summary["final_metrics"]
    if not isinstance(final, dict):
        raise MetricSchemaError(f"{where}: final_metrics must be an object")
    for tag, value in final.items():
        try:
            spec = schema.spec_of(tag)
        except MetricSchemaError as e:
            raise MetricSchemaError(f"{where}: final_metrics: {e}") from None
        if value is None:
            if not spec.allow_nonfinite:
                raise MetricSchemaError(
                    f"{where}: final_metrics['{tag}'] is null; it must be a number"
                )
            continue
        if type(value) not in (int, float) or not math.isfinite(value):
            raise MetricSchemaError(
                f"{where}: final_metrics['{tag}'] = {value!r} is not a finite number"
            )
    for key, types in SUMMARY_OPTIONAL.items():
        if key not in summary:
            continue
        value = summary[key]
        bad_number = isinstance(value, float) and not math.isfinite(value)
        if isinstance(value, bool) or not isinstance(value, types) or bad_number:
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise MetricSchemaError(f"{where}: field '{key}' must be {names}")


def _check_time(value: Any, key: str, where: str, nullable: bool) -> None:
    if value is None and nullable:
        return
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise MetricSchemaError(f"{where}: {key} {value!r} is not an ISO 8601 time") from None


def read_summary(path: PathLike) -> dict:
    """Read and validate ``run_summary.json`` (a run directory or the file itself); fail closed."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    if not path.is_file():
        raise MetricSchemaError(
            f"no {SUMMARY_FILE} at {path.parent} (missing metric_schema_version; a pre-schema run "
            "needs --legacy-unversioned)"
        )
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MetricSchemaError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    validate_summary(summary, where=str(path))
    return summary


TRUST_HINT = (
    "loading a checkpoint unpickles code from it: pass --trust-checkpoint only for a "
    "checkpoint you trust"
)


def check_trusted_checkpoint(checkpoint: PathLike, run_dir: PathLike, trust: bool) -> None:
    """Refuse (one line) a checkpoint that is not inside a run directory raylab wrote (its
    run_config.json and a valid run_summary.json), unless the user vouches for it."""
    if trust:
        return
    run = Path(run_dir)
    try:
        read_summary(run)
        ok = (run / CONFIG_FILE).is_file()
    except MetricSchemaError:
        ok = False
    if not ok:
        raise UserError(
            f"'{run}' is not a run directory raylab wrote (no run_config.json and valid "
            f"{SUMMARY_FILE}); {TRUST_HINT}"
        )
    try:
        Path(checkpoint).resolve().relative_to(run.resolve())
    except ValueError:
        raise UserError(
            f"checkpoint '{checkpoint}' is outside the run directory '{run}'; {TRUST_HINT}"
        ) from None


class RunDirectory:
    """One run's directory and its ``run_config.json`` / ``run_summary.json``."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self._summary: Optional[dict] = None

    @classmethod
    def create(cls, cfg: Any, now: Optional[datetime] = None) -> "RunDirectory":
        """Resolve and claim a new run directory for ``cfg``."""
        return cls(resolve_run_dir(cfg, now=now, create=True))

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def video_path(self) -> Path:
        return self.path / VIDEO_FILE

    @property
    def episodes_path(self) -> Path:
        return self.path / EPISODES_FILE

    # ------------------------------------------------------------------ files
    def append_episodes(self, env_steps: int, iteration: int, episodes) -> None:
        """Append the (return, length) of the episodes that ended in training iteration
        ``iteration`` (the run at ``env_steps`` when it ended) to ``episodes.csv``, header on
        the first write; appended and closed per iteration, so a crash loses at most the
        iteration in flight. A restored run redoes the iterations after its checkpoint: the
        rows of those iterations written before are dropped first."""
        path = self.episodes_path
        last = getattr(self, "_last_episode_iteration", None)
        if last is None and path.exists():
            rows = self.read_episodes()
            last = rows[-1][1] if rows else -1
        if last is not None and iteration <= last:
            kept = [r for r in self.read_episodes() if r[1] < iteration]
            path.unlink()
            if kept:
                self._write_episode_rows([(s, i, r, n) for s, i, r, n in kept])
        self._write_episode_rows([(env_steps, iteration, r, n) for r, n in episodes])
        self._last_episode_iteration = int(iteration)

    def _write_episode_rows(self, rows) -> None:
        new = not self.episodes_path.exists()
        with open(self.episodes_path, "a", encoding="utf-8") as f:
            if new:
                f.write("env_steps,iteration,return,length\n")
            f.writelines(f"{int(s)},{int(i)},{float(r)!r},{int(n)}\n" for s, i, r, n in rows)

    def read_episodes(self) -> list:
        """``episodes.csv`` as [(env_steps, iteration, return, length)]."""
        if not self.episodes_path.exists():
            return []
        rows = []
        for line in self.episodes_path.read_text(encoding="utf-8").splitlines()[1:]:
            steps, iteration, ret, length = line.split(",")
            rows.append((int(steps), int(iteration), float(ret), int(length)))
        return rows

    def write_config(self, config: Any) -> Path:
        """Write the composed config as ``run_config.json`` with secrets redacted."""
        return write_json_atomic(self.config_path, redact(config_to_dict(config)))

    def read_config(self) -> dict:
        return json.loads(self.config_path.read_text(encoding="utf-8"))

    def write_summary(
        self,
        status: str = "running",
        runtime_manifest: Optional[dict] = None,
        final_metrics: Optional[Mapping[str, Any]] = None,
        start_time: Optional[str] = None,
        end_time: Optional[str] = None,
        **extra: Any,
    ) -> dict:
        """Write a complete ``run_summary.json`` (validated first); return what was written.

        Times may be ISO strings, ``datetime`` objects or epoch seconds; they are stored as ISO
        8601 strings.
        """
        summary = {
            "metric_schema_version": schema.METRIC_SCHEMA_VERSION,
            "status": status,
            "start_time": as_iso_time(start_time) or now_iso(),
            "end_time": as_iso_time(end_time),
            "runtime_manifest": runtime_manifest,
            "final_metrics": _final_metrics_json(final_metrics or {}),
            **extra,
        }
        validate_summary(summary, where=str(self.summary_path))
        write_json_atomic(self.summary_path, summary)
        self._summary = summary
        return dict(summary)

    def update_summary(self, **fields: Any) -> dict:
        """Change some fields of ``run_summary.json`` (written first if there is none yet).

        Moving to a final status (completed / failed / interrupted) stamps ``end_time`` unless
        given. ``final_metrics`` replaces the previous final metrics.
        """
        if "metric_schema_version" in fields:
            raise MetricSchemaError("metric_schema_version is set by raylab, not by the caller")
        current = self._summary
        if current is None and self.summary_path.is_file():
            current = read_summary(self.summary_path)
        if current is None:
            current = {"status": "running", "start_time": now_iso()}
        merged = {k: v for k, v in current.items() if k != "metric_schema_version"}
        merged.update(fields)
        if merged.get("status", "running") != "running" and not merged.get("end_time"):
            merged["end_time"] = now_iso()
        return self.write_summary(**merged)

    def finish(self, status: str = "completed", **fields: Any) -> dict:
        """Record the final status (and, typically, ``final_metrics``)."""
        return self.update_summary(status=status, **fields)

    def read_summary(self) -> dict:
        return read_summary(self.summary_path)
