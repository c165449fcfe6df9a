"""The live terminal panel: width tiers, labels, shares, the 2 s window, plain and live modes."""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from rich.console import Console

from raylab import terminal as T
from raylab.metrics import schema as S

REPO = Path(__file__).resolve().parents[1]
LEARNER_ONLY = (
    "Collector Wait",
    "Episode Transfer",
    "Replay Stage",
    "Replay Sample",
    "Learning",
    "Weight Publish",
    "Other",
)


def synthetic_samples(algo: str) -> List[Dict[str, float]]:
    """Two hand-made iterations with round, known values, for the rendering logic tests (the
    docs frames use the samples recorded from real runs, T.example_panel)."""
    base: Dict[str, float] = {
        S.TRAIN_MEAN_REWARD: 212.4,
        S.TRAIN_MEAN_EPISODE_LENGTH: 231.0,
        S.EPISODE_TIMEOUT_RATE: 0.62,
        S.PERF_TOTAL_FPS: 48210.0,
        S.PERF_LEARNER_ROWS_PER_S: 47950.0,
        S.PERF_LEARNER_UPDATES_PER_S: 11.8,
        S.PERF_WEIGHT_BROADCAST_MS: 3.4,
        S.PERF_COLLECTOR_MLP_INFER_MS: 0.41,
        S.PERF_COLLECTOR_ENV_STEP_MS: 1.92,
        S.PERF_COLLECTOR_BACKEND_STEP_MS: 1.31,
        S.PERF_COLLECTOR_UPDATE_STATE_MS: 0.38,
        S.PERF_COLLECTOR_RESET_DONE_MS: 0.11,
        S.PERF_COLLECTOR_APPLY_ACTION_MS: 0.012,
        S.PERF_COLLECTOR_ACTION_VALIDATE_MS: 0.004,
        S.PERF_COLLECTION_TIME: 0.512,
        S.PERF_LEARNER_COLLECTOR_WAIT_MS: 41.0,
        S.PERF_LEARNER_EPISODE_TRANSFER_MS: 18.5,
        S.PERF_LEARNING_TIME: 0.871,
        S.PERF_ITERATION_TIME: 1.004,
        S.loss_tag("total"): 0.4183,
        S.loss_tag("policy"): -0.0121,
        S.loss_tag("value"): 0.8712,
        S.policy_tag("entropy"): 9.84,
        S.policy_tag("grad_norm"): 0.733,
        S.policy_tag("learning_rate"): 3.0e-4,
        S.reward_tag("alive"): 1.0,
        S.reward_tag("upright"): 0.742,
        S.reward_tag("base_height"): 0.318,
        S.reward_tag("joint_pos"): -0.0412,
        S.reward_tag("action_rate"): -0.0187,
        S.reward_tag("torques"): -0.00061,
    }
    if algo == "appo":
        base.update(
            {
                S.PERF_LEARNER_REPLAY_STAGE_MS: 12.2,
                S.PERF_LEARNER_REPLAY_SAMPLE_MS: 4.1,
                S.PERF_LEARNER_WEIGHT_PUBLISH_MS: 9.6,
                S.PERF_LEARNER_INGEST_MS: 22.7,
                S.PERF_POLICY_STALENESS: 1.5,
                S.policy_tag("importance_ratio"): 0.998,
                S.policy_tag("vf_explained_var"): 0.912,
            }
        )
    elif algo == "ppo":
        base.update(
            {
                S.loss_tag("kl"): 0.0042,
                S.policy_tag("kl_coeff"): 0.2,
                S.policy_tag("vf_explained_var"): 0.912,
            }
        )
    elif algo == "sac":
        for tag in (
            S.loss_tag("total"),
            S.loss_tag("policy"),
            S.loss_tag("value"),
            S.policy_tag("entropy"),
        ):
            base.pop(tag)
        base.update(
            {
                S.loss_tag("critic"): 1.273,
                S.loss_tag("actor"): -38.61,
                S.loss_tag("alpha"): -0.0312,
                S.policy_tag("alpha"): 0.0418,
                S.policy_tag("q_mean"): 40.21,
                S.PERF_LEARNER_REPLAY_BATCH_WAIT_MS: 0.8,
                S.PERF_LEARNER_REPLAY_SAMPLE_MS: 6.3,
                S.PERF_REPLAY_BUFFER_SIZE: 1_000_000.0,
                S.PERF_POLICY_STALENESS: 1.0,
                S.PERF_COLLECTOR_REPLAY_WRITE_MS: 0.27,
                S.PERF_COLLECTOR_METRICS_PUBLISH_MS: 0.004,
            }
        )
    second = {k: v * 1.02 for k, v in base.items()}  # every time and value 2% up
    if S.PERF_REPLAY_BUFFER_SIZE in base:
        second[S.PERF_REPLAY_BUFFER_SIZE] = base[S.PERF_REPLAY_BUFFER_SIZE]
    return [base, second]


def synthetic_panel(algo: str = "appo") -> Tuple[T.TerminalPanel, float]:
    """A panel fed :func:`synthetic_samples` half a second apart, and the time to render it."""
    system = T.SystemInfo(
        algo=algo,
        task="microduck_balance",
        runners=4,
        envs_per_runner=64,
        learners=1,
        gpus_per_learner=0.0,
    )
    panel = T.TerminalPanel(system)
    t = 100.0
    for i, metrics in enumerate(synthetic_samples(algo)):
        panel.add_sample(
            metrics,
            t + 0.5 * i,
            iteration=241 + i,
            env_steps=11_520_000 + 61_440 * i,
            time_total_s=247.3 + 0.5 * i,
        )
    return panel, t + 0.9


def capture(renderable, width: int) -> str:
    console = Console(record=True, width=width, force_terminal=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def frame(algo: str, width: int) -> str:
    panel, now = synthetic_panel(algo)
    return capture(panel.render(width, now), width)


def recorded_frame(algo: str, width: int) -> str:
    panel, now = T.example_panel(algo)
    return capture(panel.render(width, now), width)


def line_index(text: str, *needles: str) -> int:
    """Index of the first line that holds every needle (-1 when none does)."""
    for i, line in enumerate(text.splitlines()):
        if all(n in line for n in needles):
            return i
    return -1


def row(text: str, label: str):
    """(ms, pct or None) of the first timing row with this exact label."""
    m = re.search(rf"(?<!\w){re.escape(label)} +(-?[\d,.]+)(?: +([\d.]+))?(?= |│)", text)
    assert m, f"no row {label!r} in\n{text}"
    return float(m.group(1).replace(",", "")), (float(m.group(2)) if m.group(2) else None)


def system(algo="appo", **kw):
    base = dict(algo=algo, task="microduck_balance", runners=4, envs_per_runner=64, learners=1)
    base.update(kw)
    return T.SystemInfo(**base)


def timing_metrics(**extra):
    m = {
        S.PERF_ITERATION_TIME: 1.0,
        S.PERF_LEARNER_COLLECTOR_WAIT_MS: 100.0,
        S.PERF_LEARNER_EPISODE_TRANSFER_MS: 50.0,
        S.PERF_LEARNING_TIME: 0.7,
    }
    m.update(extra)
    return m


# ------------------------------------------------------------------------------ width tiers


def test_tier_boundaries():
    assert [T.tier_of(w) for w in (60, 95, 96, 119, 120, 200)] == [
        "narrow",
        "narrow",
        "compact",
        "compact",
        "wide",
        "wide",
    ]


def test_narrow_tier_stacks_sections_and_has_one_timing_column():
    text = frame("appo", 80)
    metrics, rewards = line_index(text, "Metrics"), line_index(text, "Rewards")
    learner, collector = line_index(text, "Learner", "ms"), line_index(text, "Collector", "ms")
    assert 0 < metrics < rewards < learner < collector
    assert line_index(text, "Metrics", "Rewards") == -1
    assert line_index(text, "Learner", "Collector") == -1
    assert "Learner (Iter Wall)" not in text and "Collector (own clock)" not in text
    # the timing rows are one column: every learner row comes before the collector header
    assert line_index(text, "Weight Publish") < collector < line_index(text, "Rollout Wall")


def test_compact_tier_pairs_metrics_with_rewards_and_uses_short_timing_headers():
    text = frame("appo", 100)
    assert line_index(text, "Metrics", "Rewards") > 0
    header = line_index(text, "Learner", "Collector")
    assert header > line_index(text, "Metrics", "Rewards")
    assert "Learner (Iter Wall)" not in text and "Collector (own clock)" not in text
    assert line_index(text, "Learner", "Collector", "System") == -1
    assert line_index(text, "System") > header


def test_wide_tier_has_three_timing_columns():
    text = frame("appo", 140)
    assert line_index(text, "Metrics", "Rewards") > 0
    assert line_index(text, "Learner (Iter Wall)", "Collector (own clock)", "System") > 0
    assert line_index(text, "Collector Wait", "MLP Infer", "Envs") > 0


@pytest.mark.parametrize("width", [80, 100, 140])
def test_every_line_fits_and_the_title_shows_gpus(width):
    text = frame("appo", width)
    lines = text.splitlines()
    assert all(len(line) == width for line in lines)
    assert "GPUs 0" in lines[0]
    assert "…" not in text


@pytest.mark.parametrize("algo", S.ALGORITHMS)
@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_labels_are_never_truncated(algo, width):
    panel, now = synthetic_panel(algo)
    values = panel.snapshot(now).values
    labels = [label for label, _ in T.metric_rows(values)]
    labels += [term for term, _ in T.reward_rows(values)]
    labels += [r.label for r in T.learner_rows(values, algo) + T.collector_rows(values, algo)]
    labels += [label for label, _ in T.system_rows(values, panel.system)]
    text = frame(algo, width)
    missing = [label for label in labels if label not in text]
    assert not missing
    assert "…" not in text


def test_precision_drops_before_labels_at_narrow_width():
    panel, now = synthetic_panel("appo")
    wide, narrow = frame("appo", 140), frame("appo", 80)
    assert re.search(r"Mean Reward +214\.5", wide)
    assert re.search(r"Mean Reward +215 ", narrow)


# ------------------------------------------------------------------------------ learner column


@pytest.mark.parametrize("algo", S.ALGORITHMS)
@pytest.mark.parametrize("width", [80, 100, 140])
def test_learner_shares_add_to_100_within_rounding(algo, width):
    text = frame(algo, width)
    panel, now = synthetic_panel(algo)
    values = panel.snapshot(now).values
    main = [T.LEARNER_LABELS[t] for t in S.LEARNER_MAIN_PHASES[algo] if t in values]
    main.append(T.OTHER_LABEL)
    shares = [row(text, label)[1] for label in main]
    assert all(p is not None for p in shares)
    assert abs(sum(shares) - 100.0) <= 0.05 * len(shares) + 1e-9
    assert row(text, "Iter Wall")[1] == 100.0


def test_other_is_wall_minus_main_phases_and_each_share_uses_the_wall():
    panel = T.TerminalPanel(system("ppo"))
    panel.add_sample(timing_metrics(), 0.0)
    text = capture(panel.render(140, 0.0), 140)
    assert row(text, "Collector Wait") == (100.0, 10.0)
    assert row(text, "Episode Transfer") == (50.0, 5.0)
    assert row(text, "Learning") == (700.0, 70.0)
    assert row(text, "Other") == (150.0, 15.0)
    assert row(text, "Iter Wall") == (1000.0, 100.0)


def test_nested_background_and_collector_times_are_not_in_the_learner_sum():
    panel = T.TerminalPanel(system("appo"))
    panel.add_sample(
        timing_metrics(
            **{
                # an APPO main phase (episode transfer is not)
                S.PERF_LEARNER_REPLAY_SAMPLE_MS: 50.0,
                S.PERF_DP_GRADIENT_SYNC_MS_PER_RANK: 200.0,  # nested in Learning
                S.PERF_LEARNER_INGEST_MS: 300.0,  # background
                S.PERF_COLLECTION_TIME: 5.0,  # collector clock
                S.PERF_COLLECTOR_ENV_STEP_MS: 400.0,
            }
        ),
        0.0,
    )
    text = capture(panel.render(140, 0.0), 140)
    assert row(text, "Other") == (150.0, 15.0)
    assert row(text, "Grad Sync/rank") == (200.0, None)
    assert row(text, "Ingest (bg)") == (300.0, None)
    # the nested row is indented under its parent phase
    lines = text.splitlines()
    i = line_index(text, "Grad Sync/rank")
    assert "Learning" in lines[i - 1]
    assert re.search(r"│ {3}Grad Sync/rank", lines[i])


def test_accounted_above_the_wall_clamps_other_and_is_flagged():
    panel = T.TerminalPanel(system("ppo"))
    panel.add_sample(timing_metrics(**{S.PERF_LEARNING_TIME: 0.9}), 0.0)
    text = capture(panel.render(140, 0.0), 140)
    assert row(text, "Other") == (0.0, 0.0)
    assert row(text, T.ACCOUNTED_LABEL) == (1050.0, 105.0)
    ok = T.TerminalPanel(system("ppo"))
    ok.add_sample(timing_metrics(), 0.0)
    assert T.ACCOUNTED_LABEL not in capture(ok.render(140, 0.0), 140)


def test_phases_of_other_algorithms_get_no_rows():
    panel = T.TerminalPanel(system("ppo"))
    panel.add_sample(timing_metrics(**{S.PERF_LEARNER_WEIGHT_PUBLISH_MS: 20.0}), 0.0)
    text = capture(panel.render(140, 0.0), 140)
    assert "Weight Publish" not in text
    assert row(text, "Other") == (150.0, 15.0)


def test_every_timing_tag_has_a_label():
    kinds = ("main_phase", "wall", "nested", "background")
    for algo in S.ALGORITHMS:
        for tag in S.tags_for(algo, kinds=kinds):
            assert tag in T.LEARNER_LABELS, tag
        for tag in S.tags_for(algo, kinds=("collector", "collector_nested")):
            assert tag in T.COLLECTOR_LABELS, tag
    labels = list(T.LEARNER_LABELS.values()) + list(T.COLLECTOR_LABELS.values())
    assert len(set(labels)) == len(labels)


# ------------------------------------------------------------------------------ collector column


def test_ppo_and_appo_collector_shows_milliseconds_without_shares():
    for algo in ("ppo", "appo"):
        text = frame(algo, 140)
        assert row(text, "MLP Infer")[1] is None
        assert row(text, "Env Step")[1] is None
        assert row(text, "Rollout Wall") == (pytest.approx(517.1), None)
        assert T.CYCLE_LABEL not in text


def test_sac_collector_shares_are_of_its_cycle():
    text = frame("sac", 140)
    cycle_ms, cycle_pct = row(text, T.CYCLE_LABEL)
    assert cycle_pct == 100.0
    parts = [row(text, label) for label in ("MLP Infer", "Env Step", "Replay Write")]
    # the cycle also holds Metrics Publish (0.004 ms, 0.15%), a quiet phase below 1%: no row
    quiet_ms = 0.004 * 1.01
    assert sum(ms for ms, _ in parts) + quiet_ms == pytest.approx(cycle_ms, abs=0.002)
    shares = sum(p for _, p in parts) + 100 * quiet_ms / cycle_ms
    assert abs(shares - 100.0) <= 0.05 * len(parts)
    # the Rollout Wall is a whole-sample total: milliseconds only
    assert row(text, "Rollout Wall")[1] is None


def test_quiet_collector_diagnostics_show_only_above_one_percent():
    # APPO: nested env-step details against Env Step (1.92 ms): Apply Action is 0.6%
    text = frame("appo", 140)
    assert "Backend Step" in text and "Apply Action" not in text and "Action Validate" not in text
    panel, now = synthetic_panel("appo")
    panel.add_sample(
        {S.PERF_COLLECTOR_ENV_STEP_MS: 1.0, S.PERF_COLLECTOR_APPLY_ACTION_MS: 0.1}, now
    )  # window mean: 0.041 of 1.63 ms, 2.5%
    assert "Apply Action" in capture(panel.render(140, now), 140)
    # SAC: quiet cycle phase (Metrics Publish: 0.004 of a 2.6 ms cycle) against the cycle
    assert "Metrics Publish" not in frame("sac", 140)
    values = {S.PERF_COLLECTOR_ENV_STEP_MS: 1.0, S.PERF_COLLECTOR_METRICS_PUBLISH_MS: 0.05}
    rows = {r.label: r for r in T.collector_rows(values, "sac")}
    assert rows["Metrics Publish"].pct == pytest.approx(100 * 0.05 / 1.05)
    values[S.PERF_COLLECTOR_METRICS_PUBLISH_MS] = 0.01  # 0.99% of the cycle
    assert "Metrics Publish" not in {r.label for r in T.collector_rows(values, "sac")}


# ------------------------------------------------------------------------------ system, header


def test_system_column_and_gpu_title():
    panel = T.TerminalPanel(
        system("sac", runners=3, envs_per_runner=32, learners=2, gpus_per_learner=1.0)
    )
    panel.add_sample({S.PERF_REPLAY_BUFFER_SIZE: 250_000.0, S.EPISODE_TIMEOUT_RATE: 0.25}, 0.0)
    text = capture(panel.render(140, 0.0), 140)
    assert "GPUs 2" in text.splitlines()[0]
    for label, value in (
        ("Envs", "96"),
        ("Envs/Runner", "32"),
        ("Runners", "3"),
        ("Learners", "2"),
        ("Devices", "2 GPU"),
        ("Buffer", "250,000"),
        ("Timeout", "25.0%"),
    ):
        assert re.search(rf"{re.escape(label)} +{re.escape(value)}(?!\S)", text), label
    appo = capture(T.TerminalPanel(system("appo")).render(140, 0.0), 140)
    assert "Buffer" not in appo and "GPUs 0" in appo.splitlines()[0]


def test_system_facts_come_from_the_composed_config():
    config = {
        "algo": {"name": "appo"},
        "task": "go2_joystick_flat",
        "env": {"num_envs": 128},
        "resources": {"num_env_runners": 2, "num_learners": 0},
        "training": {"terminal": "off"},
    }
    info = T.SystemInfo.from_config(config, num_gpus_per_learner=1.0)
    assert (info.algo, info.task, info.envs, info.envs_per_runner, info.runners) == (
        "appo",
        "go2_joystick_flat",
        256,
        128,
        2,
    )
    assert info.gpus == 1.0 and info.devices == "1 GPU"
    assert T.make_reporter(config, 1.0, console=Console(file=io.StringIO())).mode == "off"


def test_header_shows_job_totals_and_progress():
    panel = T.TerminalPanel(system())
    panel.add_sample(
        {S.PERF_TOTAL_FPS: 40_000.0, S.PERF_LEARNER_ROWS_PER_S: 30_000.0},
        10.0,
        iteration=7,
        env_steps=123_456,
        time_total_s=65.0,
    )
    panel.add_sample(
        {S.PERF_TOTAL_FPS: 50_000.0, S.PERF_LEARNER_ROWS_PER_S: 32_000.0},
        11.0,
        iteration=8,
        env_steps=173_456,
        time_total_s=66.0,
    )
    text = capture(panel.render(140, 11.5), 140)
    for field in (
        "Iter 8",
        "Steps 173,456",
        "Steps/s 45,000",
        "Rows/s 31,000",
        "Elapsed 0:01:06",
        "Avg 2s (n=2)",
        "APPO · microduck_balance",
    ):
        assert field in text, field


def test_metrics_and_rewards_use_short_stable_labels():
    values = {
        S.TRAIN_MEAN_REWARD: 12.5,
        S.TRAIN_MEAN_EPISODE_LENGTH: 100.0,
        S.loss_tag("value"): 0.5,
        S.loss_tag("policy"): 0.25,
        S.loss_tag("my_aux"): 1.0,
        S.policy_tag("grad_norm"): 2.0,
        S.policy_tag("entropy"): 3.0,
        S.reward_tag("upright"): 0.75,
        S.reward_tag("alive"): 1.0,
        S.termination_tag("fell"): 3.0,
    }
    assert [k for k, _ in T.metric_rows(values)] == [
        "Mean Reward",
        "Ep Length",
        "Policy Loss",
        "Value Loss",
        "My Aux Loss",
        "Entropy",
        "Grad Norm",
    ]
    assert T.reward_rows(values) == [("alive", 1.0), ("upright", 0.75)]
    panel = T.TerminalPanel(system())
    panel.add_sample(values, 0.0)
    text = capture(panel.render(100, 0.0), 100)
    assert re.search(r"upright +0\.7500", text) and re.search(r"alive +1\.000", text)
    assert "fell" not in text


def test_the_latest_evaluation_is_shown_until_the_next_one():
    panel = T.TerminalPanel(system())
    panel.add_sample(
        {
            S.TRAIN_MEAN_REWARD: 10.0,
            S.EVAL_MEAN_REWARD: 40.0,
            S.EVAL_SURVIVAL: 0.5,
            S.PERF_EVALUATION_MS: 2500.0,
        },
        0.0,
    )
    panel.add_sample({S.TRAIN_MEAN_REWARD: 11.0}, 10.0)  # later samples carry no evaluation
    snap = panel.snapshot(10.0)
    assert snap.values[S.EVAL_MEAN_REWARD] == 40.0  # outside the 2 s window, still shown
    labels = dict(T.metric_rows(snap.values))
    assert labels["Eval Reward"] == 40.0 and labels["Eval Survival"] == 0.5
    assert "eval 40.00" in T.progress_line(snap)
    text = capture(panel.render(140, 10.0), 140)
    assert re.search(r"Eval Reward +40\.0", text) and re.search(r"Eval Time +2\.50* s", text), text
    panel.add_sample({S.EVAL_MEAN_REWARD: 30.0}, 11.0)
    assert "eval 30.00 (best 40.00)" in T.summary_line(panel, 11.0)


def test_number_format():
    assert T.fmt_number(None) == "-"
    assert T.fmt_number(float("nan")) == "nan"
    assert T.fmt_number(0.0) == "0"
    assert T.fmt_number(48210.4) == "48,210"
    assert T.fmt_number(212.44) == "212.4"
    assert T.fmt_number(-0.012345) == "-0.01235"
    assert T.fmt_number(0.000612) == "6.12e-04"
    assert T.fmt_number(212.44, sig=3) == "212"
    assert T.fmt_duration(3725.9) == "1:02:05"


# ------------------------------------------------------------------------------ the 2 s window


def test_window_mean_drops_samples_older_than_two_seconds():
    w = T.SampleWindow(2.0)
    w.add({S.TRAIN_MEAN_REWARD: 10.0}, 0.0)
    w.add({S.TRAIN_MEAN_REWARD: 20.0, S.PERF_TOTAL_FPS: 100.0}, 1.0)
    w.add({S.TRAIN_MEAN_REWARD: 30.0}, 2.5)
    values, n, age = w.mean(2.5)
    assert (n, values[S.TRAIN_MEAN_REWARD], values[S.PERF_TOTAL_FPS], age) == (2, 25.0, 100.0, 0.0)
    assert w.mean(3.0)[1] == 2  # exactly 2 s old: still in
    values, n, _ = w.mean(3.01)
    # the t=1 sample is out; its Steps/s is in no later sample, so that tag keeps its last value
    assert (n, values) == (1, {S.TRAIN_MEAN_REWARD: 30.0, S.PERF_TOTAL_FPS: 100.0})
    values, n, age = w.mean(5.0)  # nothing recent: last values, n = 0
    assert (n, values[S.TRAIN_MEAN_REWARD], age) == (0, 30.0, 2.5)
    assert T.SampleWindow().mean(0.0) == ({}, 0, None)


def test_a_tag_missing_from_the_window_keeps_its_last_value():
    # APPO iterations without a learner result carry no learner metrics: the rows stay
    panel = T.TerminalPanel(system("ppo"))
    panel.add_sample(timing_metrics(**{S.TRAIN_MEAN_REWARD: 1.0}), 0.0)
    panel.add_sample({S.TRAIN_MEAN_REWARD: 3.0}, 3.0)
    panel.add_sample({S.TRAIN_MEAN_REWARD: 5.0}, 4.0)
    text = capture(panel.render(140, 4.0), 140)
    assert "Avg 2s (n=2)" in text and re.search(r"Mean Reward +4\.000", text)
    assert row(text, "Other") == (150.0, 15.0)


def test_window_keeps_only_what_a_later_window_can_use():
    w = T.SampleWindow(2.0)
    for t in range(100):
        w.add({S.TRAIN_MEAN_REWARD: float(t)}, float(t) * 0.5)
    assert len(w._samples) == 5  # 47.5 .. 49.5


def test_header_counts_the_samples_in_the_window():
    panel = T.TerminalPanel(system())
    for t, reward in ((0.0, 10.0), (0.5, 20.0), (1.0, 30.0)):
        panel.add_sample({S.TRAIN_MEAN_REWARD: reward}, t)
    text = capture(panel.render(100, 1.0), 100)
    assert "Avg 2s (n=3)" in text and re.search(r"Mean Reward +20\.00", text)
    text = capture(panel.render(100, 2.25), 100)
    assert "Avg 2s (n=2)" in text and re.search(r"Mean Reward +25\.00", text)
    text = capture(panel.render(100, 4.0), 100)
    assert "Avg 2s (n=0, last 3.0s ago)" in text and re.search(r"Mean Reward +30\.00", text)


# ------------------------------------------------------------------------------ reporter modes


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def result(i: int) -> dict:
    return {
        "training_iteration": i,
        "time_total_s": float(i),
        "env_runners": {"num_env_steps_sampled_lifetime": 1000 * i},
    }


def test_not_a_tty_prints_a_compact_line_every_few_seconds():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=80, force_terminal=False)
    reporter = T.TerminalReporter(system(), "auto", console=console, clock=clock)
    assert reporter.mode == "plain"
    for i in range(1, 8):
        clock.t = float(i - 1)
        reporter(
            None,
            result(i),
            {S.PERF_TOTAL_FPS: 1000.0, S.TRAIN_MEAN_REWARD: 5.0, S.PERF_ITERATION_TIME: 1.0},
        )
    reporter.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at t=0 and t=5, then the summary
    assert lines[0] == (
        "raylab iter 1  steps 1,000  Steps/s 1,000  reward 5.000  iter_wall 1.00s  elapsed 0:00:01"
    )
    assert lines[1].startswith("raylab iter 6  steps 6,000  ")
    assert lines[2].startswith("raylab: 7 iterations, 7,000 env steps in 0:00:07")
    assert "\x1b" not in out.getvalue()


def test_live_mode_starts_on_the_first_sample_and_close_restores_the_terminal():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=100, force_terminal=True)
    reporter = T.TerminalReporter(system(), "auto", console=console, clock=clock)
    assert reporter.mode == "live" and reporter._live is None
    reporter(None, result(1), {S.TRAIN_MEAN_REWARD: 5.0})
    assert reporter._live is not None and reporter._live.is_started
    live = reporter._live
    reporter.close()
    reporter.close()  # idempotent
    assert not live.is_started and reporter._live is None
    text = out.getvalue()
    assert "Avg 2s (n=1)" in text
    assert text.rstrip().endswith("(best 5.000)")
    assert text.count("\x1b[?25h") == 1  # the cursor is shown again
    reporter(None, result(2), {})  # a late sample after close draws nothing
    assert reporter._live is None


def test_off_mode_shows_nothing_and_bad_modes_fail():
    out = io.StringIO()
    reporter = T.TerminalReporter(system(), "off", console=Console(file=out, force_terminal=True))
    reporter(None, result(1), {S.TRAIN_MEAN_REWARD: 5.0})
    reporter.close()
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="valid choices: auto, live, plain, off"):
        T.TerminalReporter(system(), "fancy", console=Console(file=out))


def test_reporter_pickles_to_a_plain_reporter():
    reporter = T.TerminalReporter(
        system(), "live", console=Console(file=io.StringIO(), force_terminal=True)
    )
    reporter(None, result(1), {S.TRAIN_MEAN_REWARD: 5.0})
    copy = pickle.loads(pickle.dumps(reporter))
    reporter.close()
    assert copy.mode == "plain" and copy.panel.system == reporter.panel.system
    assert copy.panel.samples == 0


def test_summary_without_iterations():
    panel = T.TerminalPanel(system())
    assert T.summary_line(panel, 0.0) == "raylab: no training iteration completed"


# ------------------------------------------------------------------------------ docs


@pytest.mark.parametrize("algo,width", [("appo", 80), ("appo", 100), ("appo", 140), ("sac", 140)])
def test_docs_show_the_current_capture_of_each_tier(algo, width):
    docs = (REPO / "docs" / "terminal.md").read_text(encoding="utf-8")
    assert recorded_frame(algo, width).rstrip("\n") in docs, (
        f"docs/terminal.md is stale: paste `python -m raylab.terminal --width {width} "
        f"--algo {algo}`"
    )


def test_docs_show_the_current_plain_line_and_summary():
    docs = (REPO / "docs" / "terminal.md").read_text(encoding="utf-8")
    panel, now = T.example_panel("appo")
    assert T.progress_line(panel.snapshot(now)) in docs
    assert T.summary_line(panel, now) in docs
