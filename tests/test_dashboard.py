"""Canonical metrics as Ray custom metrics (raylab.dashboard).

Gauge names are derived from the canonical tags by one function and follow Ray's / Prometheus'
metric-name rule; the values set are read back from the metrics endpoint of a real local Ray
node (what Prometheus scrapes and the dashboard's metrics view shows).
"""

from __future__ import annotations

import math
import re
import socket
import time
import urllib.request
from typing import Dict, Tuple

import pytest

from raylab import dashboard as D
from raylab.metrics import schema as S

PROMETHEUS_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # Ray's rule (util/metrics.py)
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def exact_tags():
    return [name for name, spec in S.TAGS.items() if not spec.is_family]


# --------------------------------------------------------------------------------- names


def test_gauge_names_follow_rays_rule_and_are_unique():
    names = {}
    for tag in exact_tags():
        for share in (False, True):
            name = D.gauge_name(tag, share)
            assert PROMETHEUS_NAME.match(name) and "/" not in name and ":" not in name, name
            assert name.startswith(D.PREFIX)
            assert name not in names, (tag, names.get(name))
            names[name] = tag
    assert D.gauge_name(S.PERF_TOTAL_FPS) == "raylab_perf_total_fps"
    assert D.gauge_name(S.TRAIN_MEAN_REWARD) == "raylab_train_mean_reward"
    assert D.gauge_name(S.PERF_LEARNING_TIME, share=True) == "raylab_perf_learning_time_share"
    assert D.gauge_name(S.loss_tag("policy")) == "raylab_loss_policy"


@pytest.mark.parametrize("bad", ["Perf/not_a_tag", "perf/steps_per_sec", "Perf/learning_time_ms"])
def test_gauge_name_refuses_a_non_canonical_tag(bad):
    with pytest.raises(S.MetricSchemaError):
        D.gauge_name(bad)


# --------------------------------------------------------------------------------- values


def appo_metrics() -> Dict[str, float]:
    return {
        S.TRAIN_MEAN_REWARD: -812.5,
        S.PERF_TOTAL_FPS: 3456.0,
        S.PERF_ITERATION_TIME: 0.5,  # seconds
        S.PERF_LEARNING_TIME: 0.3,  # seconds
        S.PERF_LEARNER_COLLECTOR_WAIT_MS: 100.0,  # milliseconds
        S.PERF_LEARNER_REPLAY_SAMPLE_MS: 25.0,
        S.PERF_LEARNER_INGEST_MS: 40.0,  # background: no share
        S.PERF_ENV_RUNNER_RESTARTS: 2.0,
        S.loss_tag("policy"): 1.25,
        S.reward_tag("alive"): 0.5,  # task term families are not exported
    }


def test_shares_are_main_phase_over_iteration_wall_in_seconds():
    values = D.exported_values(appo_metrics(), "appo")
    shares = {tag: v for (tag, share), v in values.items() if share}
    assert shares == pytest.approx(
        {
            S.PERF_LEARNING_TIME: 0.6,
            S.PERF_LEARNER_COLLECTOR_WAIT_MS: 0.2,
            S.PERF_LEARNER_REPLAY_SAMPLE_MS: 0.05,
        }
    )
    assert set(shares) <= set(S.LEARNER_MAIN_PHASES["appo"])
    plain = {tag for (tag, share) in values if not share}
    assert S.reward_tag("alive") not in plain and S.loss_tag("policy") in plain
    # PPO has no replay-sample phase: the same metrics give no share for it.
    ppo = {tag for (tag, share) in D.exported_values(appo_metrics(), "ppo") if share}
    assert S.PERF_LEARNER_REPLAY_SAMPLE_MS not in ppo


def test_no_shares_without_a_measured_wall_and_non_finite_values_are_skipped():
    m = appo_metrics()
    del m[S.PERF_ITERATION_TIME]
    m[S.loss_tag("value")] = math.nan  # allowed by the schema, but not a gauge value
    values = D.exported_values(m, "appo")
    assert not any(share for (_, share) in values)
    assert (S.loss_tag("value"), False) not in values


def test_bad_input_fails_with_one_clear_line():
    with pytest.raises(S.MetricSchemaError, match="unknown algorithm 'dqn'; valid choices"):
        D.exported_values(appo_metrics(), "dqn")
    with pytest.raises(S.MetricSchemaError, match="unregistered metric tag 'fps'"):
        D.exported_values({"fps": 1.0}, "appo")
    with pytest.raises(ValueError, match="run_name and a trial_id"):
        D.DashboardExporter("", "t")


# --------------------------------------------------------------------------------- real Ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_with_metrics(ray_in_process):
    """The node's metrics endpoint of the test process's Ray (exported every 0.5 s)."""
    return ray_in_process.metrics_url


def scrape(url: str) -> Dict[Tuple[str, str, str], float]:
    """(metric, RunName, TrialId) -> value of every raylab sample on the node's endpoint."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or not m["name"].startswith("ray_" + D.PREFIX):
            continue
        labels = dict(LABEL.findall(m["labels"]))
        out[(m["name"], labels.get("RunName"), labels.get("TrialId"))] = float(m["value"])
    return out


def wait_for(url: str, expected: Dict[Tuple[str, str, str], float], timeout: float = 60.0):
    deadline, seen = time.time() + timeout, {}
    while time.time() < deadline:
        seen = scrape(url)
        if all(k in seen and seen[k] == pytest.approx(v) for k, v in expected.items()):
            return seen
        time.sleep(0.5)
    missing = {k: (v, seen.get(k)) for k, v in expected.items() if seen.get(k) != pytest.approx(v)}
    raise AssertionError(f"gauges not exported as sent (expected, seen): {missing}")


def test_gauges_are_registered_with_the_values_sent_tagged_by_run_and_trial(ray_with_metrics):
    url = ray_with_metrics
    run = "2026-01-01_00-00-00_mujoco"
    a = D.DashboardExporter(run, "trial_a")
    b = D.DashboardExporter(run, "trial_b")
    sent_a = a.export(appo_metrics(), "appo")
    sent_b = b.export({**appo_metrics(), S.PERF_TOTAL_FPS: 999.0}, "appo")
    for needed in (
        "raylab_perf_total_fps",
        "raylab_train_mean_reward",
        "raylab_perf_iteration_time",
        "raylab_perf_learning_time_share",
        "raylab_perf_learner_collector_wait_ms_share",
    ):
        assert needed in sent_a
    assert sent_a["raylab_perf_learning_time_share"] == pytest.approx(0.6)

    expected = {("ray_" + name, run, "trial_a"): v for name, v in sent_a.items()}
    expected.update({("ray_" + name, run, "trial_b"): v for name, v in sent_b.items()})
    wait_for(url, expected)
    assert expected[("ray_raylab_perf_total_fps", run, "trial_b")] == 999.0

    # A later result replaces the value of that trial only.
    again = a.export({**appo_metrics(), S.PERF_TOTAL_FPS: 4000.0}, "appo")
    assert again["raylab_perf_total_fps"] == 4000.0
    wait_for(
        url,
        {
            ("ray_raylab_perf_total_fps", run, "trial_a"): 4000.0,
            ("ray_raylab_perf_total_fps", run, "trial_b"): 999.0,
        },
    )


def test_export_result_reads_the_algorithm_from_the_run_directory(ray_with_metrics, tmp_path):
    from raylab.config import compose, to_dict
    from raylab.metrics.rundir import RunDirectory

    run_dir = tmp_path / "2026-01-02_00-00-00_mujoco"
    run_dir.mkdir()
    RunDirectory(run_dir).write_config(to_dict(compose("ppo", "Pendulum-v1")))
    sent = D.export_result(run_dir, "trial_c", appo_metrics())
    # PPO's main phases: no replay-sample share although the tag is in the metrics.
    assert "raylab_perf_learner_replay_sample_ms_share" not in sent
    assert sent["raylab_perf_learning_time_share"] == pytest.approx(0.6)
    wait_for(
        ray_with_metrics,
        {
            ("ray_raylab_perf_learning_time_share", run_dir.name, "trial_c"): 0.6,
        },
    )


def test_export_result_never_raises(tmp_path, capsys):
    assert D.export_result(tmp_path / "not_a_run", "trial_x", appo_metrics()) == {}
    assert D.export_result(tmp_path / "not_a_run", "trial_x", appo_metrics()) == {}
    err = capsys.readouterr().err
    assert err.count("raylab: dashboard metrics not exported") == 1  # once per trial


# ------------------------------------------------------------------------------- Grafana board


def exporter_names() -> set:
    """Every gauge name the exporter can set: each algorithm's export of a result that has
    every exact tag and every known Loss / Policy member."""
    metrics = {tag: 1.0 for tag in exact_tags()}
    for family in (S.LOSS_FAMILY, S.POLICY_FAMILY):
        spec = S.TAGS[family]
        metrics.update({spec.family_prefix + m: 1.0 for m, _ in spec.member_labels})
    names = set()
    for algo in S.LEARNER_MAIN_PHASES:
        names |= {D.gauge_name(tag, share) for tag, share in D.exported_values(metrics, algo)}
    return names


def test_the_grafana_board_queries_only_gauges_the_exporter_sets():
    board = D.grafana_board()
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    exprs.append(board["templating"]["list"][1]["query"])
    queried = {m for e in exprs for m in re.findall(r"\bray_(raylab_\w+)", e)}
    assert queried and queried <= exporter_names(), queried - exporter_names()
    # Throughput, every algorithm's learner phases as shares, losses, rewards are on it.
    for tag, share in [(S.PERF_TOTAL_FPS, False), (S.TRAIN_MEAN_REWARD, False)] + [
        (p, True) for phases in S.LEARNER_MAIN_PHASES.values() for p in phases
    ]:
        assert D.gauge_name(tag, share) in queried
    assert D.gauge_name("Loss/policy") in queried


def test_the_committed_grafana_board_is_the_one_the_schema_builds():
    import json

    from conftest import REPO

    committed = json.loads((REPO / D.GRAFANA_FILE).read_text())
    assert committed == D.grafana_board(), (
        f"{D.GRAFANA_FILE} is stale: python -m raylab.dashboard grafana {D.GRAFANA_FILE}"
    )
