"""`raylab metrics extract`: real event files in, canonical table / CSV out, fail closed."""

from __future__ import annotations

import csv
import json
import math

import pytest
from torch.utils.tensorboard import SummaryWriter

from raylab.cli import main as raylab_main
from raylab.metrics import schema
from raylab.metrics.backends import TensorBoardBackend
from raylab.metrics.extract import extract
from raylab.metrics.rundir import RunDirectory
from raylab.metrics.schema import MetricSchemaError


def canonical_run(path, steps=(1, 2, 3)):
    """A run written the way training writes one: backend + run_summary.json."""
    path.mkdir(parents=True, exist_ok=True)
    rd = RunDirectory(path)
    rd.write_summary(algo="appo")
    with TensorBoardBackend(path) as backend:
        for s in steps:
            backend.log(
                s * 100,
                {
                    schema.TRAIN_MEAN_REWARD: float(s),
                    schema.PERF_TOTAL_FPS: 1000.0 * s,
                    schema.PERF_LEARNING_TIME: 0.5,
                },
            )
        backend.log(300, {schema.loss_tag("policy"): float("nan")})
    rd.finish("completed", final_metrics={schema.TRAIN_MEAN_REWARD: 3.0})
    return path


def raw_run(path, tags: dict, summary=None, config=None):
    """Event files written directly (bypassing the schema), as old or foreign runs are."""
    path.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(log_dir=str(path))
    for tag, points in tags.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()
    if summary is not None:
        (path / "run_summary.json").write_text(json.dumps(summary))
    if config is not None:
        (path / "run_config.json").write_text(json.dumps(config))
    return path


def test_extract_canonical_run(tmp_path):
    run = canonical_run(tmp_path / "run")
    table = extract(run)
    assert table.schema_version == 1 and not table.legacy_unversioned
    assert table.tags == [
        "Loss/policy",
        "Perf/learning_time",
        "Perf/total_fps",
        "Train/mean_reward",
    ]
    assert table.steps == [100, 200, 300]
    assert table.column("Train/mean_reward") == [(100, 1.0), (200, 2.0), (300, 3.0)]
    assert math.isnan(table.values["Loss/policy"][300])
    rows = list(csv.DictReader(table.to_csv_string().splitlines()))
    assert [r["step"] for r in rows] == ["100", "200", "300"]
    assert rows[0]["Perf/total_fps"] == "1000.0" and rows[0]["Loss/policy"] == ""
    arrow = table.to_arrow()
    assert arrow.column("Perf/total_fps").to_pylist() == [1000.0, 2000.0, 3000.0]
    assert arrow.schema.metadata[b"metric_schema_version"] == b"1"


def test_cli_extract_writes_csv(tmp_path, capsys):
    run = canonical_run(tmp_path / "run")
    out = tmp_path / "out.csv"
    assert raylab_main(["metrics", "extract", str(run), "--csv", str(out)]) == 0
    assert "wrote 3 steps x 4 tags" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert rows[1]["Train/mean_reward"] == "2.0"
    assert raylab_main(["metrics", "extract", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("step,wall_time,Loss/policy,")


@pytest.mark.parametrize(
    "tags, summary, message",
    [
        ({"Perf/total_fps": [(1, 1.0)]}, None, "no run_summary.json"),
        ({"Perf/total_fps": [(1, 1.0)]}, {"status": "completed"}, "missing metric_schema_version"),
        ({"Perf/total_fps": [(1, 1.0)]}, "v2", "unsupported metric_schema_version 2"),
        (
            {"Perf/total_fps": [(1, 1.0)], "Perf/mystery_ms": [(1, 1.0)]},
            "v1",
            "unregistered metric tag 'Perf/mystery_ms'",
        ),
        (
            {"Perf/total_fps": [(1, 1.0)], "perf/iter_ms": [(1, 5.0)]},
            "v1",
            "mixed canonical and legacy tags",
        ),
        ({"perf/iter_ms": [(1, 5.0)]}, "v1", "retired legacy tag 'perf/iter_ms'"),
        ({"Perf/learning_time_ms": [(1, 5.0)]}, "v1", "wrong unit suffix"),
        ({"Perf/learner_rows_per_s": [(1, 5.0)]}, "v1", "terminal-only tag"),
        ({"Perf/learning_time": [(1, float("nan"))]}, "v1", "must be finite"),
    ],
)
def test_extract_fails_closed(tmp_path, tags, summary, message):
    if summary in ("v1", "v2"):
        summary = {
            "metric_schema_version": int(summary[1]),
            "status": "running",
            "start_time": "2026-03-09T18:30:00+00:00",
            "end_time": None,
            "runtime_manifest": None,
            "final_metrics": {},
        }
    run = raw_run(tmp_path / "run", tags, summary)
    with pytest.raises(MetricSchemaError, match=message):
        extract(run)


def test_extract_fails_closed_without_event_files_or_on_non_scalars(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    RunDirectory(run).write_summary()
    with pytest.raises(MetricSchemaError, match="no TensorBoard event files"):
        extract(run)
    writer = SummaryWriter(log_dir=str(run))
    writer.add_text("notes", "hello", 0)
    writer.close()
    with pytest.raises(MetricSchemaError, match="non-scalar"):
        extract(run)
    with pytest.raises(MetricSchemaError, match="does not exist"):
        extract(tmp_path / "nope")


def test_cli_failure_is_one_line_exit_2(tmp_path, capsys):
    run = raw_run(tmp_path / "run", {"perf/steps_per_sec": [(1, 1.0)]})
    assert raylab_main(["metrics", "extract", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run_summary.json" in err and "--legacy-unversioned" in err


LEGACY = {
    "perf/steps_per_sec": [(1, 500.0), (2, 600.0)],
    "reward/mean": [(1, 9.0), (2, 9.0)],
    "reward/mean_ep100": [(1, 1.0), (2, 2.0)],
    "perf/iter_ms": [(1, 1500.0), (2, 2500.0)],
    "train/dp_sync_time": [(2, 0.25)],
    "timing/collector_rollout_ms": [(2, 250.0)],
    "perf/collector_cycle_ms": [(1, 3.0)],
    "Episode_Reward/alive": [(1, 3.0)],
}


def test_legacy_unversioned_migrates_names_and_units(tmp_path):
    run = raw_run(tmp_path / "old", LEGACY)
    with pytest.raises(MetricSchemaError, match="no run_summary.json"):
        extract(run)  # the default reader never guesses
    table = extract(run, legacy_unversioned=True)
    assert table.legacy_unversioned and table.schema_version == 1
    assert table.tags == [
        "Perf/collection_time",
        "Perf/dp_gradient_sync_ms_per_rank",
        "Perf/iteration_time",
        "Perf/total_fps",
        "Train/mean_reward",
    ]
    assert table.column("Perf/iteration_time") == [(1, 1.5), (2, 2.5)]  # ms -> s
    assert table.column("Perf/dp_gradient_sync_ms_per_rank") == [(2, 250.0)]  # s -> ms
    assert table.column("Perf/collection_time") == [(2, 0.25)]
    assert table.column("Train/mean_reward") == [(1, 1.0), (2, 2.0)]  # mean_ep100 preferred
    assert table.dropped == ("Episode_Reward/alive", "perf/collector_cycle_ms")


def test_legacy_unversioned_cli(tmp_path, capsys):
    run = raw_run(tmp_path / "old", LEGACY)
    out = tmp_path / "legacy.csv"
    assert (
        raylab_main(["metrics", "extract", str(run), "--legacy-unversioned", "--csv", str(out)])
        == 0
    )
    assert "migrated from legacy tags" in capsys.readouterr().out
    assert "Perf/iteration_time" in out.read_text().splitlines()[0]


@pytest.mark.parametrize(
    "tags, summary, message",
    [
        (
            {"perf/iter_ms": [(1, 1.0)], "Perf/total_fps": [(1, 1.0)]},
            None,
            "canonical tag 'Perf/total_fps' present",
        ),
        (
            {"perf/iter_ms": [(1, 1.0)], "reward/alive": [(1, 1.0)]},
            None,
            "canonical tag 'reward/alive'",
        ),
        (
            {"perf/iter_ms": [(1, 1.0)], "custom/thing": [(1, 1.0)]},
            None,
            "'custom/thing' is neither",
        ),
        (
            {"perf/iter_ms": [(1, 1.0)]},
            {"metric_schema_version": 1},
            "has a metric_schema_version stamp",
        ),
        ({"timing/learner_incremental_h2d_ms": [(1, 1.0)]}, None, "maps per algorithm"),
    ],
)
def test_legacy_unversioned_fails_closed(tmp_path, tags, summary, message):
    run = raw_run(tmp_path / "old", tags, summary)
    with pytest.raises(MetricSchemaError, match=message):
        extract(run, legacy_unversioned=True)


def test_legacy_per_algorithm_mapping_reads_run_config(tmp_path):
    run = raw_run(
        tmp_path / "appo",
        {"timing/learner_incremental_h2d_ms": [(1, 4.0)]},
        config={"algo": {"name": "appo"}},
    )
    assert extract(run, legacy_unversioned=True).tags == ["Perf/learner_replay_stage_ms"]
    run = raw_run(
        tmp_path / "sac", {"timing/learner_incremental_h2d_ms": [(1, 4.0)]}, config={"algo": "sac"}
    )
    assert extract(run, legacy_unversioned=True).tags == ["Perf/replay_ingress_h2d_submit_ms"]


def test_resumed_run_latest_value_per_step_wins(tmp_path):
    run = canonical_run(tmp_path / "run", steps=(1, 2))
    with TensorBoardBackend(run) as backend:  # a resumed driver re-logs step 200
        backend.log(200, {schema.TRAIN_MEAN_REWARD: 7.0})
    assert extract(run).column("Train/mean_reward") == [(100, 1.0), (200, 7.0)]


def test_installed_console_command(tmp_path, cli):
    """The real `raylab` executable: success, and a one-line failure with exit code 2."""
    run = canonical_run(tmp_path / "run")
    ok = cli("metrics", "extract", str(run), "--csv", str(tmp_path / "out.csv"))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "out.csv").read_text().startswith("step,wall_time,")
    bad = cli("metrics", "extract", str(raw_run(tmp_path / "bad", {"Perf/nope": [(1, 1.0)]})))
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "no run_summary.json" in bad.stderr
    unknown = cli("metrics", "extrakt")
    assert unknown.returncode == 2 and "did you mean 'extract'" in unknown.stderr
