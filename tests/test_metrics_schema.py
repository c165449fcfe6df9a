"""The canonical metric schema: registry rules, fail-closed validation, legacy table, docs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from raylab.metrics import schema
from raylab.metrics.cli import default_docs_path, render_docs
from raylab.metrics.cli import main as metrics_main
from raylab.metrics.schema import MetricSchemaError

REPO = Path(__file__).resolve().parents[1]


def test_version_and_required_tags_registered():
    # The contract's tags for the paths raylab has (learner-owned inference is not one).
    assert schema.METRIC_SCHEMA_VERSION == 1
    required = [
        "Train/mean_reward",
        "Train/mean_episode_length",
        "Episode/timeout_rate",
        "Perf/total_fps",
        "Perf/collection_time",
        "Perf/learning_time",
        "Perf/iteration_time",
        "Perf/learner_collector_wait_ms",
        "Perf/learner_replay_batch_wait_ms",
        "Perf/learner_replay_stage_ms",
        "Perf/learner_replay_sample_ms",
        "Perf/learner_weight_publish_ms",
        "Perf/replay_ingress_h2d_submit_ms",
        "Perf/dp_gradient_sync_ms_per_rank",
        "Perf/dp_gradient_sync_calls_per_rank",
        "Perf/learner_episode_transfer_ms",
        "Perf/weight_broadcast_ms",
        "Perf/learner_ingest_ms",
        "Perf/env_runner_restarts",
        "Perf/learner_rows_per_s",
        "Perf/learner_updates_per_s",
        "Perf/policy_staleness",
        "Perf/replay_buffer_size",
        "Perf/collector_env_step_ms",
        "Perf/collector_mlp_infer_ms",
        "Perf/collector_replay_write_ms",
        "reward/<term>",
        "Episode_Termination/<term>",
        "Loss/<name>",
        "Policy/<name>",
    ]
    missing = [t for t in required if t not in schema.TAGS]
    assert not missing


def test_every_exact_tag_has_a_constant_named_after_it():
    for name, spec in schema.TAGS.items():
        if spec.is_family:
            continue
        const = name.upper().replace("/", "_")
        assert getattr(schema, const) == name, const


def test_units_follow_the_suffix_rule():
    for name, spec in schema.TAGS.items():
        if spec.is_family:
            continue
        if re.search(r"_ms(_per_rank)?$", name):
            assert spec.unit == "ms", name
        else:
            assert spec.unit != "ms", name
    for name in ("Perf/learning_time", "Perf/collection_time", "Perf/iteration_time"):
        assert schema.TAGS[name].unit == "s"


def test_spec_fields_and_raylab_specific_phases():
    ept = schema.TAGS[schema.PERF_LEARNER_EPISODE_TRANSFER_MS]
    assert ept.kind == "main_phase" and ept.owner == "learner"
    # Only PPO's learner resolves episode refs on its main thread; APPO does it on the
    # request thread beside the learner thread (background ingest).
    assert ept.algorithms == frozenset({"ppo"})
    assert schema.PERF_LEARNER_EPISODE_TRANSFER_MS not in schema.LEARNER_MAIN_PHASES["appo"]
    # Learner-owned inference is no raylab path (its EnvRunners own inference): not registered,
    # its pre-schema names retired.
    assert "Perf/learner_inference_ms" not in schema.TAGS
    assert "timing/inference_total_ms" in schema.RETIRED_TAGS
    wb = schema.TAGS[schema.PERF_WEIGHT_BROADCAST_MS]
    assert wb.kind == "runner" and wb.owner == "runner"
    assert all(wb.name not in phases for phases in schema.LEARNER_MAIN_PHASES.values())
    assert schema.TAGS[schema.PERF_TOTAL_FPS].aggregation == "sum"
    assert schema.TAGS[schema.PERF_LEARNER_ROWS_PER_S].persisted is False
    assert schema.TAGS[schema.PERF_LEARNER_ROWS_PER_S].aggregation == "sum"
    assert schema.TAGS[schema.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS].kind == "background"
    assert schema.TAGS[schema.PERF_LEARNER_INGEST_MS].kind == "background"
    assert (
        schema.TAGS[schema.PERF_COLLECTOR_ACTION_VALIDATE_MS].parent
        == schema.PERF_COLLECTOR_ENV_STEP_MS
    )
    assert schema.TAGS[schema.PERF_COLLECTION_TIME].kind == "collector"


def test_learner_main_phases_are_ordered_per_algorithm():
    assert set(schema.LEARNER_MAIN_PHASES) == {"ppo", "appo", "sac"}
    appo = schema.LEARNER_MAIN_PHASES["appo"]
    assert appo[0] == schema.PERF_LEARNER_COLLECTOR_WAIT_MS
    assert (
        appo.index(schema.PERF_LEARNER_REPLAY_SAMPLE_MS)
        < appo.index(schema.PERF_LEARNING_TIME)
        < appo.index(schema.PERF_LEARNER_WEIGHT_PUBLISH_MS)
    )
    ppo = schema.LEARNER_MAIN_PHASES["ppo"]
    assert (
        ppo.index(schema.PERF_LEARNER_EPISODE_TRANSFER_MS)
        < ppo.index(schema.PERF_LEARNER_REPLAY_STAGE_MS)
        < ppo.index(schema.PERF_LEARNING_TIME)
    )
    sac = schema.LEARNER_MAIN_PHASES["sac"]
    assert (
        sac.index(schema.PERF_LEARNER_REPLAY_BATCH_WAIT_MS)
        < sac.index(schema.PERF_LEARNER_REPLAY_SAMPLE_MS)
        < sac.index(schema.PERF_LEARNING_TIME)
    )
    assert schema.PERF_LEARNER_REPLAY_STAGE_MS not in sac
    for phases in schema.LEARNER_MAIN_PHASES.values():
        assert schema.PERF_ITERATION_TIME not in phases
        assert all(schema.TAGS[p].kind == "main_phase" for p in phases)


def test_learner_other_is_wall_minus_main_phases_in_seconds():
    m = {
        schema.PERF_ITERATION_TIME: 2.0,
        schema.PERF_LEARNER_COLLECTOR_WAIT_MS: 250.0,
        schema.PERF_LEARNING_TIME: 1.5,
        schema.PERF_DP_GRADIENT_SYNC_MS_PER_RANK: 999.0,  # nested: never counted
        schema.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS: 999.0,  # background: never counted
    }
    assert schema.learner_other_s(m, "appo") == pytest.approx(0.25)
    m[schema.PERF_LEARNING_TIME] = 5.0
    assert schema.learner_other_s(m, "appo") == 0.0  # clamped
    assert schema.learner_other_s({schema.PERF_LEARNING_TIME: 1.0}, "ppo") is None
    with pytest.raises(MetricSchemaError, match="valid choices"):
        schema.learner_other_s(m, "dqn")


def test_normalize_accepts_numbers_numpy_and_tensors():
    out = schema.normalize(
        {
            schema.PERF_TOTAL_FPS: np.float32(1.5),
            schema.TRAIN_MEAN_REWARD: torch.tensor(2.0),
            schema.PERF_ENV_RUNNER_RESTARTS: 3,
            schema.reward_tag("alive"): np.float64(0.25),
        }
    )
    assert out == {
        "Perf/total_fps": 1.5,
        "Train/mean_reward": 2.0,
        "Perf/env_runner_restarts": 3.0,
        "reward/alive": 0.25,
    }
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize(
    "tag, message",
    [
        ("Perf/not_a_tag", "unregistered metric tag 'Perf/not_a_tag'"),
        ("perf/total_fps", "unregistered metric tag"),
        ("Perf/learning_time_ms", "wrong unit suffix: the canonical tag is 'Perf/learning_time'"),
        ("Perf/iteration_time_s", "wrong unit suffix"),
        (
            "Perf/learner_collector_wait_s",
            "wrong unit suffix: the canonical tag is 'Perf/learner_collector_wait_ms'",
        ),
        ("Perf/total_fps_ms", "wrong unit suffix"),
        ("Loss/critic_ms", "wrong unit suffix"),
        ("perf/iter_ms", "retired legacy tag 'perf/iter_ms': use 'Perf/iteration_time'"),
        ("reward/mean", "retired legacy tag"),
        ("timing/learner_other_ms", "has no replacement"),
        ("perf/learner_learning_pct", "has no replacement"),
        ("Episode_Reward/alive", "has no replacement"),
        ("reward/", "unregistered"),
    ],
)
def test_validate_fails_closed_on_bad_tags(tag, message):
    with pytest.raises(MetricSchemaError, match=re.escape(message)):
        schema.validate({tag: 1.0})


def test_non_finite_values_fail_unless_the_tag_allows_them():
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(MetricSchemaError, match="must be finite"):
            schema.validate({schema.PERF_LEARNING_TIME: bad})
        with pytest.raises(MetricSchemaError, match="must be finite"):
            schema.validate({schema.reward_tag("alive"): bad})
    out = schema.normalize({schema.loss_tag("critic"): math.nan, schema.policy_tag("kl"): math.inf})
    assert math.isnan(out["Loss/critic"]) and out["Policy/kl"] == math.inf


def test_non_numbers_fail():
    for bad in ("1.0", True, None, [1.0, 2.0], np.zeros(3)):
        with pytest.raises(MetricSchemaError, match="not a real number"):
            schema.validate({schema.PERF_TOTAL_FPS: bad})


def test_family_helpers():
    assert schema.reward_tag("alive") == "reward/alive"
    assert schema.termination_tag("fall") == "Episode_Termination/fall"
    assert schema.loss_tag("policy") == "Loss/policy"
    assert schema.policy_tag("entropy") == "Policy/entropy"
    for bad in ("", "a/b", "x y"):
        with pytest.raises(MetricSchemaError, match="bad term"):
            schema.reward_tag(bad)
    with pytest.raises(MetricSchemaError, match="retired legacy tag 'reward/mean'"):
        schema.reward_tag("mean")
    assert schema.TAGS["Episode_Termination/<term>"].aggregation == "sum"


def test_the_envs_log_keys_are_the_schema_families():
    """The envs (bottom layer) spell the two family prefixes themselves; they must stay the
    schema's."""
    from raylab.envs.core import managers

    for term in ("alive", "upright", "time_out", "fallen"):
        assert managers.reward_tag(term) == schema.reward_tag(term)
        assert managers.termination_tag(term) == schema.termination_tag(term)


def test_persisted_only_drops_terminal_only_tags():
    m = schema.normalize({schema.PERF_TOTAL_FPS: 10.0, schema.PERF_LEARNER_ROWS_PER_S: 99.0})
    assert schema.persisted_only(m) == {schema.PERF_TOTAL_FPS: 10.0}


def test_legacy_table_is_data_with_unit_factors():
    mig = schema.LEGACY_MIGRATION
    assert mig["perf/iter_ms"].canonical == schema.PERF_ITERATION_TIME
    assert mig["perf/iter_ms"].factor == 0.001
    assert mig["train/dp_sync_time"].factor == 1000.0
    assert mig["timing/collector_rollout_ms"].canonical == schema.PERF_COLLECTION_TIME
    assert "timing/collector_inference_wait_ms" not in mig  # retired with its path
    assert schema.migrate_legacy("timing/learner_incremental_h2d_ms", "appo") == (
        schema.PERF_LEARNER_REPLAY_STAGE_MS,
        1.0,
    )
    assert schema.migrate_legacy("timing/learner_incremental_h2d_ms", "sac") == (
        schema.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS,
        1.0,
    )
    with pytest.raises(MetricSchemaError, match="per algorithm"):
        schema.migrate_legacy("timing/learner_incremental_h2d_ms")
    assert schema.migrate_legacy("perf/collector_cycle_ms") is None
    with pytest.raises(MetricSchemaError, match="not a recognised"):
        schema.migrate_legacy("Perf/total_fps")
    # every legacy tag is rejected by validate, and every target is canonical
    for old, rule in mig.items():
        assert not schema.is_canonical(old)
        targets = [rule.canonical] if isinstance(rule.canonical, str) else rule.canonical.values()
        assert all(schema.is_canonical(t) for t in targets)


def test_no_other_module_spells_a_canonical_tag():
    """The schema module is the single source of truth: raylab code outside it uses constants."""
    pattern = re.compile(r"""["'](Perf|Train|Episode)/[a-z_]+["']""")
    offenders = []
    for root in ("raylab", "algorithms", "envs"):
        for path in (REPO / root).rglob("*.py"):
            if path.name == "schema.py" and path.parent.name == "metrics":
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{i}")
    assert not offenders, offenders


def test_docs_are_generated_from_the_registry_and_current():
    text = render_docs()
    for name in schema.TAGS:
        assert f"`{name}`" in text
    for old in schema.LEGACY_MIGRATION:
        assert f"`{old}`" in text
    assert (REPO / "docs" / "metrics.md").read_text(encoding="utf-8") == text, (
        "docs/metrics.md is stale: run `raylab metrics docs`"
    )
    assert default_docs_path() == REPO / "docs" / "metrics.md"


def test_docs_check_detects_a_stale_file(tmp_path, capsys):
    out = tmp_path / "metrics.md"
    assert metrics_main(["docs", "--out", str(out)]) == 0
    assert metrics_main(["docs", "--check", "--out", str(out)]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert metrics_main(["docs", "--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
