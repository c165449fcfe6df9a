"""Run directories, run_config.json / run_summary.json, atomic writes, fail-closed reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from raylab.config import compose
from raylab.errors import UserError
from raylab.metrics import rundir, schema
from raylab.metrics.rundir import RunDirectory, read_summary, resolve_run_dir, write_json_atomic
from raylab.metrics.schema import MetricSchemaError

NOW = datetime(2026, 3, 9, 18, 30, 0)


@pytest.fixture
def cfg():
    return compose("sac", "microduck_balance")


def test_default_run_dir_layout(tmp_path, monkeypatch, cfg):
    monkeypatch.chdir(tmp_path)
    path = resolve_run_dir(cfg, now=NOW)
    assert path == tmp_path / "logs/sac/microduck_balance/2026-03-09_18-30-00_mujoco"
    assert path.is_dir()


def test_existing_run_dir_is_never_reused(tmp_path, cfg):
    c = compose("sac", "microduck_balance", overrides=[f"training.log_root={tmp_path}"])
    first = resolve_run_dir(c, now=NOW)
    (first / "keep.txt").write_text("x")
    second = resolve_run_dir(c, now=NOW)
    third = resolve_run_dir(c, now=NOW)
    assert first == tmp_path / "2026-03-09_18-30-00_mujoco"
    assert second == tmp_path / "2026-03-09_18-30-00_mujoco_1"
    assert third == tmp_path / "2026-03-09_18-30-00_mujoco_2"
    assert (first / "keep.txt").read_text() == "x"


def test_log_dir_is_exact_and_must_not_exist(tmp_path):
    target = tmp_path / "my_run"
    c = compose(
        "ppo",
        "microduck_balance",
        overrides=[f"training.log_dir={target}", f"training.log_root={tmp_path}/ignored"],
    )
    assert resolve_run_dir(c) == target and target.is_dir()
    with pytest.raises(UserError, match=f"training.log_dir={target} already exists") as e:
        resolve_run_dir(c)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "ignored").exists()


def test_gym_ids_become_safe_folder_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {
        "task": "ns/Env-v0",
        "sim": "mujoco",
        "algo": {"algo_log_name": "appo"},
        "training": {"log_dir": None, "log_root": None},
    }
    path = resolve_run_dir(cfg, now=NOW, create=False)
    assert path == tmp_path / "logs/appo/ns_Env-v0/2026-03-09_18-30-00_mujoco"
    assert not path.exists()


def test_write_json_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"v": float("nan")})

    def boom(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        write_json_atomic(path, {"v": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp files left


def test_killed_writer_leaves_a_complete_file(tmp_path):
    """SIGKILL a process rewriting a large summary in a loop: the file is always whole JSON."""
    path = tmp_path / "run_summary.json"
    script = textwrap.dedent(f"""
        from raylab.metrics.rundir import write_json_atomic
        i = 0
        while True:
            write_json_atomic({str(path)!r}, {{"i": i, "pad": ["x" * 100] * 20000}})
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 30
        while not path.exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    data = json.loads(path.read_text())
    assert data["i"] >= 0 and len(data["pad"]) == 20000


def test_run_config_is_redacted(tmp_path, cfg):
    rd = RunDirectory(tmp_path)
    config = {
        "training": {
            "wandb_api_key": "abc123",
            "wandb_project": "p",
            "Auth_Token": "t",
            "nested": [{"db_password": "pw", "ok": 1}],
            "client_secret": None,
        },
        "algo": {"lr": 0.1},
    }
    rd.write_config(config)
    data = json.loads((tmp_path / "run_config.json").read_text())
    assert data["training"]["wandb_api_key"] == "<redacted>"
    assert data["training"]["Auth_Token"] == "<redacted>"
    assert data["training"]["nested"] == [{"db_password": "<redacted>", "ok": 1}]
    assert data["training"]["client_secret"] is None
    assert data["training"]["wandb_project"] == "p" and data["algo"]["lr"] == 0.1
    assert "abc123" not in (tmp_path / "run_config.json").read_text()
    rd2 = RunDirectory(tmp_path / "sub")
    rd2.path.mkdir()
    rd2.write_config(cfg)  # an OmegaConf config
    assert rd2.read_config()["algo"]["name"] == "sac"


def test_summary_lifecycle(tmp_path):
    rd = RunDirectory(tmp_path)
    s = rd.write_summary(algo="sac", task="microduck_balance")
    assert s["metric_schema_version"] == schema.METRIC_SCHEMA_VERSION == 1
    assert s["status"] == "running" and s["end_time"] is None
    rd.update_summary(env_steps=1000, final_metrics={schema.PERF_TOTAL_FPS: 123.5})
    done = rd.finish(
        "completed",
        final_metrics={schema.TRAIN_MEAN_REWARD: 250.0, schema.loss_tag("critic"): float("nan")},
    )
    on_disk = read_summary(tmp_path)
    assert on_disk == done
    assert on_disk["status"] == "completed" and on_disk["end_time"] is not None
    assert on_disk["env_steps"] == 1000 and on_disk["algo"] == "sac"
    assert on_disk["final_metrics"] == {"Loss/critic": None, "Train/mean_reward": 250.0}
    assert datetime.fromisoformat(on_disk["start_time"]) <= datetime.fromisoformat(
        on_disk["end_time"]
    )
    # a fresh RunDirectory object (e.g. a resumed driver) continues from the file
    again = RunDirectory(tmp_path).update_summary(status="interrupted")
    assert again["start_time"] == on_disk["start_time"] and again["algo"] == "sac"


def test_summary_accepts_tune_fields_and_epoch_times(tmp_path):
    rd = RunDirectory(tmp_path)
    rd.update_summary(status="running", trial_id="abc_00000")
    rd.update_summary(training_iteration=3, time_total_s=12.5, env_steps=4096)
    epoch = datetime(2026, 3, 9, 19, 0, 0).timestamp()
    rd.update_summary(status="failed", end_time=epoch, error="EnvRunner crashed")
    s = read_summary(tmp_path)
    assert s["trial_id"] == "abc_00000" and s["training_iteration"] == 3
    assert s["time_total_s"] == 12.5 and s["error"] == "EnvRunner crashed"
    assert datetime.fromisoformat(s["end_time"]).timestamp() == epoch
    with pytest.raises(MetricSchemaError, match="not a time"):
        rd.update_summary(end_time=[1])
    with pytest.raises(MetricSchemaError, match="time_total_s"):
        rd.update_summary(time_total_s=float("nan"))


def test_summary_writer_rejects_bad_content(tmp_path):
    rd = RunDirectory(tmp_path)
    with pytest.raises(MetricSchemaError, match="bad status"):
        rd.write_summary(status="done")
    with pytest.raises(MetricSchemaError, match="unregistered"):
        rd.write_summary(final_metrics={"Perf/fps": 1.0})
    with pytest.raises(MetricSchemaError, match="unknown field 'notes'"):
        rd.write_summary(notes="x")
    with pytest.raises(MetricSchemaError, match="set by raylab"):
        rd.update_summary(metric_schema_version=2)
    assert not rd.summary_path.exists()


def _write(tmp_path, obj) -> Path:
    path = tmp_path / "run_summary.json"
    path.write_text(json.dumps(obj))
    return path


def _valid():
    return {
        "metric_schema_version": 1,
        "status": "running",
        "start_time": "2026-03-09T18:30:00+00:00",
        "end_time": None,
        "runtime_manifest": None,
        "final_metrics": {},
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"metric_schema_version": None}, "unsupported metric_schema_version None"),
        ({"metric_schema_version": 2}, "unsupported metric_schema_version 2; supported: 1"),
        ({"metric_schema_version": "1"}, "unsupported metric_schema_version '1'"),
        ({"metric_schema_version": True}, "unsupported metric_schema_version True"),
        ({"status": "completed"}, "needs an end_time"),
        ({"start_time": "yesterday"}, "not an ISO 8601 time"),
        ({"final_metrics": {"perf/iter_ms": 1.0}}, "retired legacy tag"),
        ({"final_metrics": {"Perf/total_fps": None}}, "must be a number"),
        ({"runtime_manifest": {"schema_version": 2}}, "unsupported schema_version 2"),
        ({"extra_field": 1}, "unknown field 'extra_field'"),
        ({"env_steps": 1.5}, "field 'env_steps' must be int"),
    ],
)
def test_read_summary_fails_closed(tmp_path, change, message):
    data = _valid()
    data.update(change)
    _write(tmp_path, data)
    with pytest.raises(MetricSchemaError, match=message):
        read_summary(tmp_path)


def test_read_summary_missing_version_or_file_or_bad_json(tmp_path):
    with pytest.raises(MetricSchemaError, match="no run_summary.json"):
        read_summary(tmp_path)
    data = _valid()
    del data["metric_schema_version"]
    _write(tmp_path, data)
    with pytest.raises(MetricSchemaError, match="missing metric_schema_version"):
        read_summary(tmp_path)
    (tmp_path / "run_summary.json").write_text("{not json")
    with pytest.raises(MetricSchemaError, match="not valid JSON"):
        read_summary(tmp_path / "run_summary.json")
    _write(tmp_path, _valid())
    assert read_summary(tmp_path)["status"] == "running"


def test_run_directory_create_and_paths(tmp_path):
    c = compose("appo", "microduck_balance", overrides=[f"training.log_root={tmp_path}"])
    rd = RunDirectory.create(c, now=NOW)
    assert rd.path == tmp_path / "2026-03-09_18-30-00_mujoco"
    assert rd.config_path.name == rundir.CONFIG_FILE
    assert rd.summary_path.name == rundir.SUMMARY_FILE
    assert rd.checkpoint_dir == rd.path / "checkpoints"
    assert rd.video_path == rd.path / "play_video.mp4"


def test_episode_log_appends_and_a_restored_run_replaces_the_iterations_it_redoes(tmp_path):
    rd = RunDirectory(tmp_path)
    assert rd.read_episodes() == []
    rd.append_episodes(100, 1, [(1.5, 10), (2.0, 20)])
    rd.append_episodes(250, 3, [(3.0, 10)])
    assert rd.episodes_path.read_text().splitlines()[0] == "env_steps,iteration,return,length"
    assert rd.read_episodes() == [(100, 1, 1.5, 10), (100, 1, 2.0, 20), (250, 3, 3.0, 10)]
    # A new driver (--resume) restored from the checkpoint of iteration 2 redoes iteration 3.
    again = RunDirectory(tmp_path)
    again.append_episodes(240, 3, [(4.0, 12)])
    assert again.read_episodes() == [(100, 1, 1.5, 10), (100, 1, 2.0, 20), (240, 3, 4.0, 12)]
    # Tune restores a failed trial in the same driver from iteration 1's checkpoint.
    again.append_episodes(150, 2, [(5.0, 9)])
    again.append_episodes(260, 3, [])
    assert again.read_episodes() == [(100, 1, 1.5, 10), (100, 1, 2.0, 20), (150, 2, 5.0, 9)]
