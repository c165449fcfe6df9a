"""Example frames of the panel (docs/terminal.md, tests): samples recorded from real runs."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from rich.console import Console

from raylab.metrics import schema as S
from raylab.terminal.render import (
    TerminalPanel,
)
from raylab.terminal.rows import (
    SystemInfo,
)


def example_samples(algo: str) -> List[Dict[str, float]]:
    """Two plausible iterations of one algorithm on Microduck balance (docs and tests)."""
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


def example_panel(algo: str = "appo") -> Tuple[TerminalPanel, float]:
    """A panel fed :func:`example_samples` half a second apart, and the time to render it."""
    system = SystemInfo(
        algo=algo,
        task="microduck_balance",
        runners=4,
        envs_per_runner=64,
        learners=1,
        gpus_per_learner=0.0,
    )
    panel = TerminalPanel(system)
    t = 100.0
    for i, metrics in enumerate(example_samples(algo)):
        panel.add_sample(
            metrics,
            t + 0.5 * i,
            iteration=241 + i,
            env_steps=11_520_000 + 61_440 * i,
            time_total_s=247.3 + 0.5 * i,
        )
    return panel, t + 0.9


def _main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m raylab.terminal", description="print an example frame of the panel"
    )
    parser.add_argument("--algo", choices=S.ALGORITHMS, default="appo")
    parser.add_argument("--width", type=int, default=None, help="columns (default: terminal)")
    args = parser.parse_args(argv)
    console = Console(width=args.width) if args.width else Console()
    panel, now = example_panel(args.algo)
    console.print(panel.render(console.width, now))
    return 0
