"""Persistent metric backends: TensorBoard (default) and Weights & Biases.

Only the driver creates a backend (creating one inside a Ray actor or task raises). Each call
``log(step, metrics)`` first validates every tag and value through the schema (fail closed),
drops terminal-only tags, and writes each remaining tag once for that step, unsmoothed. A step
may be logged in several calls as long as no tag repeats; steps never go backwards.

- ``training.logger=tensorboard``: event files in the run directory
  (``torch.utils.tensorboard.SummaryWriter``; values are stored as float32 scalars).
- ``training.logger=wandb``: a W&B run in ``<run_dir>/wandb`` (``wandb_project``, ``_entity``,
  ``_group``, ``_name`` (default: the run directory name), ``_tags``, ``_notes``, ``_mode``),
  config redacted. The same values are also written as local TensorBoard event files, so
  ``raylab metrics extract`` works for every run. ``upload_video`` logs ``play_video.mp4``.
"""

from __future__ import annotations

import operator
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from raylab.errors import UserError, choices_hint
from raylab.metrics import schema
from raylab.metrics.rundir import cfg_select, config_to_dict, redact
from raylab.metrics.schema import MetricSchemaError

LOGGERS = ("tensorboard", "wandb")
WANDB_MODES = ("online", "offline", "disabled")


def _require_driver() -> None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        raise RuntimeError(
            "metric backends are created only in the driver; send metrics to the driver instead"
        )


class MetricBackend:
    """Base class: schema validation, the once-per-step rule and the life cycle."""

    name = "base"

    def __init__(self, run_dir):
        _require_driver()
        self.run_dir = Path(run_dir)
        self._last_step: Optional[int] = None
        self._step_tags: set = set()
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> Dict[str, float]:
        """Validate ``metrics``, write the persisted tags at ``step``; return what was written."""
        if self._closed:
            raise RuntimeError(f"{self.name} backend is closed")
        if isinstance(step, bool):
            raise MetricSchemaError(f"step {step!r} is not an integer")
        try:
            step = operator.index(step)
        except TypeError:
            raise MetricSchemaError(f"step {step!r} is not an integer") from None
        if step < 0:
            raise MetricSchemaError(f"step {step} is negative")
        clean = schema.persisted_only(schema.normalize(metrics))
        if self._last_step is not None:
            if step < self._last_step:
                raise MetricSchemaError(
                    f"step {step} is before the last logged step {self._last_step}"
                )
            if step == self._last_step:
                again = sorted(self._step_tags.intersection(clean))
                if again:
                    raise MetricSchemaError(f"tag '{again[0]}' was already logged at step {step}")
            else:
                self._step_tags = set()
        self._write(step, clean)
        self._last_step = step
        self._step_tags.update(clean)
        return clean

    def _write(self, step: int, metrics: Dict[str, float]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._closed = True

    def upload_video(self, path) -> bool:
        """Upload a rendered video; True when this backend did (only W&B does)."""
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TensorBoardBackend(MetricBackend):
    """Event files written with ``torch.utils.tensorboard.SummaryWriter`` into the run dir."""

    name = "tensorboard"

    def __init__(self, run_dir):
        super().__init__(run_dir)
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.run_dir), flush_secs=30)

    def _write(self, step: int, metrics: Dict[str, float]) -> None:
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def flush(self) -> None:
        if not self._closed:
            self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._writer.close()
        super().close()


class WandbBackend(MetricBackend):
    """A W&B run (offline / online / disabled) plus local TensorBoard event files."""

    name = "wandb"

    def __init__(self, run_dir, training_cfg: Any, config_dict: Optional[Mapping] = None):
        super().__init__(run_dir)
        import wandb

        mode = cfg_select(training_cfg, "wandb_mode", "online")
        if mode not in WANDB_MODES:
            raise UserError(
                f"bad value training.wandb_mode={mode}: valid choices: {', '.join(WANDB_MODES)}"
            )
        tags = cfg_select(training_cfg, "wandb_tags") or []
        config = redact(config_to_dict(config_dict)) if config_dict is not None else None
        self._wandb = wandb
        self._run = wandb.init(
            dir=str(self.run_dir),
            mode=mode,
            project=cfg_select(training_cfg, "wandb_project"),
            entity=cfg_select(training_cfg, "wandb_entity"),
            group=cfg_select(training_cfg, "wandb_group"),
            name=cfg_select(training_cfg, "wandb_name") or self.run_dir.name,
            tags=[str(t) for t in tags] or None,
            notes=cfg_select(training_cfg, "wandb_notes"),
            config=config,
            reinit="create_new",
        )
        self._tb = TensorBoardBackend(run_dir)

    def _write(self, step: int, metrics: Dict[str, float]) -> None:
        self._tb._write(step, metrics)
        self._run.log(dict(metrics), step=step)

    def flush(self) -> None:
        self._tb.flush()

    def close(self) -> None:
        if not self._closed:
            self._tb.close()
            self._run.finish()
        super().close()

    def upload_video(self, path) -> bool:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no video at {path}")
        video = self._wandb.Video(str(path), format=path.suffix.lstrip(".") or "mp4")
        self._run.log({schema.MEDIA_PLAY_VIDEO: video}, step=self._last_step or 0)
        return True


def make_backend(
    training_cfg: Any, run_dir, config_dict: Optional[Mapping] = None
) -> MetricBackend:
    """The backend ``training.logger`` selects, writing into ``run_dir``."""
    logger = cfg_select(training_cfg, "logger", "tensorboard")
    if logger == "tensorboard":
        return TensorBoardBackend(run_dir)
    if logger == "wandb":
        return WandbBackend(run_dir, training_cfg, config_dict)
    raise UserError(choices_hint(str(logger), LOGGERS, "training.logger"))
