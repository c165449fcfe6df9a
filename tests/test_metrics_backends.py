"""TensorBoard and W&B backends: real event files read back with EventAccumulator, W&B offline."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from raylab.config import compose
from raylab.errors import UserError
from raylab.metrics import schema
from raylab.metrics.backends import TensorBoardBackend, WandbBackend, make_backend
from raylab.metrics.schema import MetricSchemaError


def read_tb(run_dir: Path) -> dict:
    """tag -> [(step, value)] from every event file in run_dir (TensorBoard's own reader)."""
    out = {}
    for f in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def read_wandb_records(run_file: Path):
    """Records of a W&B ``run-*.wandb`` file (W&B's block log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk = data[pos : pos + length]
        pos += length
        if kind == 0:
            break
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    out = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        out.append(rec)
    return out


def _item_key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_tensorboard_writes_each_tag_once_per_step_unsmoothed(tmp_path):
    cfg = compose("appo", "microduck_balance")
    backend = make_backend(cfg.training, tmp_path)
    assert isinstance(backend, TensorBoardBackend)
    rewards = [1.0, 100.0, -5.0]  # jumpy: any smoothing would change them
    for step, r in zip((10, 20, 30), rewards):
        written = backend.log(
            step,
            {
                schema.TRAIN_MEAN_REWARD: np.float32(r),
                schema.PERF_TOTAL_FPS: 1000 + step,
                schema.PERF_LEARNER_ROWS_PER_S: 5.0,  # terminal-only: never persisted
                schema.loss_tag("critic"): float("nan") if step == 30 else 0.5,
            },
        )
        assert schema.PERF_LEARNER_ROWS_PER_S not in written
    backend.log(30, {schema.reward_tag("alive"): 0.25})  # same step, new tag: fine
    backend.close()

    got = read_tb(tmp_path)
    assert set(got) == {"Train/mean_reward", "Perf/total_fps", "Loss/critic", "reward/alive"}
    assert got["Train/mean_reward"] == [(10, 1.0), (20, 100.0), (30, -5.0)]
    assert got["Perf/total_fps"] == [(10, 1010.0), (20, 1020.0), (30, 1030.0)]
    assert got["Loss/critic"][:2] == [(10, 0.5), (20, 0.5)] and math.isnan(got["Loss/critic"][2][1])
    assert got["reward/alive"] == [(30, 0.25)]


def test_backend_validates_before_writing(tmp_path):
    backend = TensorBoardBackend(tmp_path)
    backend.log(1, {schema.PERF_TOTAL_FPS: 1.0})
    bad_batches = [
        ({schema.PERF_TOTAL_FPS: 2.0, "Perf/unknown_ms": 1.0}, "unregistered"),
        ({schema.PERF_TOTAL_FPS: 2.0, "perf/steps_per_sec": 1.0}, "retired legacy tag"),
        ({schema.PERF_TOTAL_FPS: 2.0, "Perf/iteration_time_ms": 1.0}, "wrong unit suffix"),
        ({schema.PERF_TOTAL_FPS: 2.0, schema.PERF_LEARNING_TIME: math.inf}, "must be finite"),
    ]
    for batch, message in bad_batches:
        with pytest.raises(MetricSchemaError, match=message):
            backend.log(2, batch)
    with pytest.raises(MetricSchemaError, match="already logged at step 1"):
        backend.log(1, {schema.PERF_TOTAL_FPS: 2.0})
    with pytest.raises(MetricSchemaError, match="before the last logged step"):
        backend.log(0, {schema.TRAIN_MEAN_REWARD: 2.0})
    for step in (-1, 1.5, True):
        with pytest.raises(MetricSchemaError):
            backend.log(step, {schema.TRAIN_MEAN_REWARD: 2.0})
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.log(5, {schema.PERF_TOTAL_FPS: 2.0})
    assert read_tb(tmp_path) == {"Perf/total_fps": [(1, 1.0)]}  # nothing of a bad batch


def test_make_backend_rejects_unknown_logger(tmp_path):
    with pytest.raises(
        UserError, match="unknown training.logger 'mlflow'; valid choices: tensorboard, wandb"
    ):
        make_backend({"logger": "mlflow"}, tmp_path)


def test_tensorboard_video_upload_is_a_no_op(tmp_path):
    with TensorBoardBackend(tmp_path) as backend:
        assert backend.upload_video(tmp_path / "play_video.mp4") is False


def test_wandb_offline_run_files(tmp_path, wandb_env):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = compose(
        "sac",
        "microduck_balance",
        overrides=[
            "training.logger=wandb",
            "training.wandb_mode=offline",
            "training.wandb_project=raylab-test",
            "training.wandb_group=g1",
            "training.wandb_tags=[a,b]",
            "training.wandb_notes=hello",
        ],
    )
    config = {"algo": {"lr": 0.001}, "training": {"wandb_api_key": "SECRET-KEY"}}
    backend = make_backend(cfg.training, run_dir, config)
    assert isinstance(backend, WandbBackend)
    backend.log(
        0,
        {
            schema.TRAIN_MEAN_REWARD: 1.5,
            schema.PERF_TOTAL_FPS: 100.0,
            schema.PERF_LEARNER_ROWS_PER_S: 9.0,
        },
    )
    backend.log(5, {schema.TRAIN_MEAN_REWARD: -2.0})
    video = run_dir / "play_video.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    assert backend.upload_video(video) is True
    backend.close()

    run_files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    # W&B's service process writes the file; now and then it is still flushing when finish()
    # returns (seen here: the 7-byte header alone). The run is complete at its exit record.
    deadline = time.monotonic() + 30.0
    while True:
        records = read_wandb_records(run_files[0])
        if (
            any(r.WhichOneof("record_type") == "exit" for r in records)
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.2)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "raylab-test" and run.run_group == "g1"
    assert list(run.tags) == ["a", "b"] and run.notes == "hello"
    assert run.display_name == "run"  # default: the run directory name
    config_items = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config_items["training"]["wandb_api_key"] == "<redacted>"
    assert config_items["algo"]["lr"] == 0.001
    assert b"SECRET-KEY" not in run_files[0].read_bytes()

    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {_item_key(i): json.loads(i.value_json) for i in r.history.item}
            history.append(row)
    scalar_rows = [
        {k: v for k, v in row.items() if not k.startswith("_") or k == "_step"} for row in history
    ]
    assert {"_step": 0, "Train/mean_reward": 1.5, "Perf/total_fps": 100.0} in scalar_rows
    assert any(
        row.get("_step") == 5 and row.get("Train/mean_reward") == -2.0 for row in scalar_rows
    )
    assert not any("Perf/learner_rows_per_s" in row for row in history)
    assert any(k.startswith(schema.MEDIA_PLAY_VIDEO + "/") for row in history for k in row)
    uploaded = list(run_files[0].parent.glob("files/media/videos/**/*.mp4"))
    assert len(uploaded) == 1 and uploaded[0].read_bytes() == video.read_bytes()
    # the same values also went to local TensorBoard event files
    tb = read_tb(run_dir)
    assert tb["Train/mean_reward"] == [(0, 1.5), (5, -2.0)]
