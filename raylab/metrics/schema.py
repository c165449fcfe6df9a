"""The canonical metric schema: the single source of truth for raylab's metric tags.

Every scalar that reaches TensorBoard / W&B, the terminal panel, ``run_summary.json`` or a
metric reader is named here, with its unit, owner, cross-worker aggregation, the algorithms that
emit it and whether it is persisted. Nothing else in the code base spells a tag string: use the
module constants (``TRAIN_MEAN_REWARD``) or the family helpers (``reward_tag("alive")``).

Rules, all enforced by :func:`validate` / :func:`normalize` (which fail closed by raising
:class:`MetricSchemaError`):

- A tag must be registered, either exactly or as a member of a family (``reward/<term>``,
  ``Episode_Termination/<term>``, ``Loss/<name>``, ``Policy/<name>``).
- Units are part of the name: a tag ending in ``_ms`` (or ``_ms_per_rank``) is milliseconds;
  ``Perf/learning_time``, ``Perf/collection_time`` and ``Perf/iteration_time`` are seconds. A
  registered tag spelled with another unit suffix is rejected as a wrong unit suffix.
- Pre-schema legacy tags are rejected; :data:`LEGACY_MIGRATION` and :data:`RETIRED_TAGS` say
  what replaced them. Only the ``--legacy-unversioned`` reader uses that table.
- Values must be real numbers; NaN / inf are rejected unless the tag allows them (losses and
  policy statistics, where a NaN is a real signal that must stay visible).

Bump :data:`METRIC_SCHEMA_VERSION` when a tag is renamed, removed, or changes unit or meaning.
Adding a tag, with docs and tests, keeps the version.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional, Tuple, Union

METRIC_SCHEMA_VERSION = 1
SUPPORTED_METRIC_SCHEMA_VERSIONS = (1,)

ALGORITHMS = ("ppo", "appo", "sac")
OWNERS = ("collector", "learner", "env_manager", "runner")
AGGREGATIONS = ("mean", "sum")
KINDS = (
    "scalar",  # progress, throughput, counters and sizes
    "main_phase",  # mutually exclusive learner main-thread phase: may be added up
    "wall",  # the learner iteration wall time, the denominator of the main phases
    "nested",  # part of one main phase; never added to the main phases
    "background",  # runs beside the learner main thread; never added
    "collector",  # EnvRunner (collector) timeline; its own clock, never added to the learner's
    "collector_nested",  # part of the collector env step; never added to the collector cycle
    "runner",  # algorithm-loop (driver side) diagnostic timing; not a learner phase
)
UNITS = {
    "ms": "milliseconds",
    "s": "seconds",
    "steps/s": "env steps per second",
    "rows/s": "replay rows per second",
    "updates/s": "gradient updates per second",
    "count": "count",
    "ratio": "fraction in [0, 1]",
    "steps": "env steps",
    "transitions": "transitions",
    "return": "undiscounted episode return",
    "reward": "reward per env step",
    "value": "algorithm-specific value",
}
SECONDS_TAGS = ("Perf/learning_time", "Perf/collection_time", "Perf/iteration_time")

_ALL = frozenset(ALGORITHMS)
_TERM_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
# Unit spellings recognised when a tag is a registered tag with the wrong unit suffix.
_UNIT_SUFFIXES = ("_ms", "_us", "_ns", "_s", "_sec", "_secs", "_seconds", "_msec")


class MetricSchemaError(ValueError):
    """A metric, tag, file or version that does not follow the canonical schema.

    The message is one line naming the offending tag or value and what is valid.
    """


@dataclass(frozen=True)
class MetricSpec:
    """One registered tag or tag family.

    ``name`` is the exact tag, or for a family its pattern (``reward/<term>``) with
    ``family_prefix`` set (``reward/``). ``persisted`` False means terminal-only: the value may be
    shown and summarised but is never written to TensorBoard / W&B. ``parent`` names the main
    phase a nested timing belongs to. ``label`` is the short row label the terminal shows for a
    timing tag; ``member_labels`` the labels of a family's known members, in display order.
    """

    name: str
    owner: str
    unit: str
    aggregation: str
    algorithms: frozenset
    description: str
    kind: str = "scalar"
    persisted: bool = True
    allow_nonfinite: bool = False
    parent: Optional[str] = None
    family_prefix: Optional[str] = None
    label: str = ""  # the terminal's row label (timing tags)
    member_labels: Tuple[Tuple[str, str], ...] = ()  # family member -> label, in display order

    @property
    def is_family(self) -> bool:
        return self.family_prefix is not None


@dataclass(frozen=True)
class LegacyRule:
    """How a pre-schema tag maps to a canonical tag.

    ``canonical`` is one tag, or a mapping algorithm -> tag when the old name meant different
    things for different algorithms. ``factor`` converts the old unit to the canonical one
    (ms -> s is 0.001). When several old tags map to the same canonical tag in one run, the one
    with the lowest ``rank`` is used.
    """

    canonical: Union[str, Mapping[str, str]]
    factor: float = 1.0
    note: str = ""
    rank: int = 0

    def target(self, algorithm: Optional[str] = None) -> str:
        if isinstance(self.canonical, str):
            return self.canonical
        if algorithm in self.canonical:
            return self.canonical[algorithm]
        choices = ", ".join(sorted(self.canonical))
        raise MetricSchemaError(
            f"legacy tag maps to a different canonical tag per algorithm; algorithm "
            f"{algorithm!r} is not one of: {choices}"
        )


# ------------------------------------------------------------------------- canonical tags
# Constants are named after the tag: upper case, '/' -> '_'. tests check the rule.

# progress
TRAIN_MEAN_REWARD = "Train/mean_reward"
TRAIN_MEAN_EPISODE_LENGTH = "Train/mean_episode_length"
EPISODE_TIMEOUT_RATE = "Episode/timeout_rate"

# evaluation during training
EVAL_MEAN_REWARD = "Eval/mean_reward"
EVAL_MEAN_EPISODE_LENGTH = "Eval/mean_episode_length"
EVAL_SURVIVAL = "Eval/survival"

# throughput
PERF_TOTAL_FPS = "Perf/total_fps"
PERF_LEARNER_ROWS_PER_S = "Perf/learner_rows_per_s"
PERF_LEARNER_UPDATES_PER_S = "Perf/learner_updates_per_s"

# learner main thread (mutually exclusive phases) and its wall
PERF_LEARNER_COLLECTOR_WAIT_MS = "Perf/learner_collector_wait_ms"
PERF_LEARNER_EPISODE_TRANSFER_MS = "Perf/learner_episode_transfer_ms"
PERF_LEARNER_REPLAY_BATCH_WAIT_MS = "Perf/learner_replay_batch_wait_ms"
PERF_LEARNER_REPLAY_STAGE_MS = "Perf/learner_replay_stage_ms"
PERF_LEARNER_REPLAY_SAMPLE_MS = "Perf/learner_replay_sample_ms"
PERF_LEARNING_TIME = "Perf/learning_time"
PERF_LEARNER_WEIGHT_PUBLISH_MS = "Perf/learner_weight_publish_ms"
PERF_ITERATION_TIME = "Perf/iteration_time"

# learner nested and background
PERF_DP_GRADIENT_SYNC_MS_PER_RANK = "Perf/dp_gradient_sync_ms_per_rank"
PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK = "Perf/dp_gradient_sync_calls_per_rank"
PERF_REPLAY_INGRESS_H2D_SUBMIT_MS = "Perf/replay_ingress_h2d_submit_ms"
PERF_LEARNER_INGEST_MS = "Perf/learner_ingest_ms"

# collector (EnvRunner) timeline
PERF_COLLECTOR_MLP_INFER_MS = "Perf/collector_mlp_infer_ms"
PERF_COLLECTOR_ENV_STEP_MS = "Perf/collector_env_step_ms"
PERF_COLLECTOR_TRANSITION_EXTRACT_MS = "Perf/collector_transition_extract_ms"
PERF_COLLECTOR_REPLAY_WRITE_MS = "Perf/collector_replay_write_ms"
PERF_COLLECTOR_METRICS_PUBLISH_MS = "Perf/collector_metrics_publish_ms"
PERF_COLLECTION_TIME = "Perf/collection_time"
PERF_COLLECTOR_ACTION_VALIDATE_MS = "Perf/collector_action_validate_ms"
PERF_COLLECTOR_APPLY_ACTION_MS = "Perf/collector_apply_action_ms"
PERF_COLLECTOR_BACKEND_STEP_MS = "Perf/collector_backend_step_ms"
PERF_COLLECTOR_UPDATE_STATE_MS = "Perf/collector_update_state_ms"
PERF_COLLECTOR_RESET_DONE_MS = "Perf/collector_reset_done_ms"

# algorithm loop (runner) diagnostics, counters and sizes
PERF_WEIGHT_BROADCAST_MS = "Perf/weight_broadcast_ms"
PERF_EVALUATION_MS = "Perf/evaluation_ms"
PERF_ENV_RUNNER_RESTARTS = "Perf/env_runner_restarts"
PERF_POLICY_STALENESS = "Perf/policy_staleness"
PERF_REPLAY_BUFFER_SIZE = "Perf/replay_buffer_size"

# families
REWARD_FAMILY = "reward/<term>"
EPISODE_TERMINATION_FAMILY = "Episode_Termination/<term>"
LOSS_FAMILY = "Loss/<name>"
POLICY_FAMILY = "Policy/<name>"

# Non-scalar media keys (W&B only); not metrics, so not in TAGS.
MEDIA_PLAY_VIDEO = "Media/play_video"


def _spec(name, owner, unit, aggregation, algorithms, description, **kw) -> MetricSpec:
    return MetricSpec(
        name=name,
        owner=owner,
        unit=unit,
        aggregation=aggregation,
        algorithms=frozenset(algorithms),
        description=description,
        **kw,
    )


_PPO, _APPO, _SAC = ("ppo",), ("appo",), ("sac",)
_OFF_POLICY = ("appo", "sac")

_SPECS: Tuple[MetricSpec, ...] = (
    # ----------------------------------------------------------------------- progress
    _spec(
        TRAIN_MEAN_REWARD,
        "collector",
        "return",
        "mean",
        _ALL,
        "Mean undiscounted return of the latest training.reward_window (default 100) episodes "
        "completed by all EnvRunners, kept by raylab across reports (and across --resume); "
        "omitted until the first episode completes; the overall training-progress curve",
    ),
    _spec(
        TRAIN_MEAN_EPISODE_LENGTH,
        "collector",
        "steps",
        "mean",
        _ALL,
        "Mean length of the same latest training.reward_window completed episodes; omitted "
        "until the first episode completes",
    ),
    _spec(
        EVAL_MEAN_REWARD,
        "collector",
        "return",
        "mean",
        _ALL,
        "Mean return of the evaluation's training.eval_episodes episodes: deterministic "
        "actions, episode k seeded training.eval_seed + k, every training.eval_every "
        "iterations (and once before the first update with training.eval_before_train, "
        "logged at env step 0); beside training (training.eval_background) logged at the "
        "first iteration after it ends; the protocol of `raylab eval`",
    ),
    _spec(
        EVAL_MEAN_EPISODE_LENGTH,
        "collector",
        "steps",
        "mean",
        _ALL,
        "Mean episode length of the same evaluation episodes",
    ),
    _spec(
        EVAL_SURVIVAL,
        "collector",
        "ratio",
        "mean",
        _ALL,
        "Robot tasks: mean over the evaluation episodes of the share of steps on which the "
        "robot was not fallen by the task's own definition (0 for an episode that "
        "terminated); the number `raylab eval` prints as survival",
    ),
    _spec(
        EPISODE_TIMEOUT_RATE,
        "collector",
        "ratio",
        "mean",
        _ALL,
        "Fraction of completed episodes that ended by the time limit rather than a "
        "termination term; omitted until the first episode completes",
    ),
    # ----------------------------------------------------------------------- throughput
    _spec(
        PERF_TOTAL_FPS,
        "collector",
        "steps/s",
        "sum",
        _ALL,
        "Env steps sampled per second, summed over all EnvRunners: total job throughput",
    ),
    _spec(
        PERF_LEARNER_ROWS_PER_S,
        "learner",
        "rows/s",
        "sum",
        _ALL,
        "Replay rows (train-batch rows) consumed per second, summed over learners; the "
        "terminal's Rows/s, never written to TensorBoard / W&B",
        persisted=False,
    ),
    _spec(
        PERF_LEARNER_UPDATES_PER_S,
        "learner",
        "updates/s",
        "mean",
        _ALL,
        "Gradient updates per second of learner wall time; data-parallel learners update in "
        "lockstep, so ranks are averaged",
    ),
    # ----------------------------------------------------------------------- learner main thread
    _spec(
        PERF_LEARNER_COLLECTOR_WAIT_MS,
        "learner",
        "ms",
        "mean",
        _ALL,
        "Learner main thread waiting for this iteration's data: PPO the synchronous "
        "EnvRunner sample, APPO the next batch in the learner queue, SAC enough new env steps "
        "for the replay ratio",
        kind="main_phase",
        label="Collector Wait",
    ),
    _spec(
        PERF_LEARNER_EPISODE_TRANSFER_MS,
        "learner",
        "ms",
        "mean",
        _PPO,
        "Learner main thread resolving and deserialising the episodes EnvRunners sent "
        "through Ray's object store (raylab; the learner does not own the collector)",
        kind="main_phase",
        label="Episode Transfer",
    ),
    _spec(
        PERF_LEARNER_REPLAY_BATCH_WAIT_MS,
        "learner",
        "ms",
        "mean",
        _SAC,
        "Waiting for the prefetched device replay batch; near zero on a prefetch hit",
        kind="main_phase",
        label="Replay Batch Wait",
    ),
    _spec(
        PERF_LEARNER_REPLAY_STAGE_MS,
        "learner",
        "ms",
        "mean",
        _PPO,
        "Turning the arrived episodes into the train batch (learner connector: GAE, value "
        "targets), synchronously on the main thread",
        kind="main_phase",
        label="Replay Stage",
    ),
    _spec(
        PERF_LEARNER_REPLAY_SAMPLE_MS,
        "learner",
        "ms",
        "mean",
        _OFF_POLICY,
        "Acquiring the ready training batch from the replay / circular buffer",
        kind="main_phase",
        label="Replay Sample",
    ),
    _spec(
        PERF_LEARNING_TIME,
        "learner",
        "s",
        "mean",
        _ALL,
        "Wall time of the learner update phase (forward, backward, optimizer steps)",
        kind="main_phase",
        label="Learning",
    ),
    _spec(
        PERF_LEARNER_WEIGHT_PUBLISH_MS,
        "learner",
        "ms",
        "mean",
        _OFF_POLICY,
        "Learner main thread making fresh weights available for the broadcast to EnvRunners",
        kind="main_phase",
        label="Weight Publish",
    ),
    _spec(
        PERF_ITERATION_TIME,
        "learner",
        "s",
        "mean",
        _ALL,
        "Learner iteration wall time from iteration start through update completion; the "
        "100% row of the learner timeline; emitted only when the complete wall was measured",
        kind="wall",
        label="Iter Wall",
    ),
    # ------------------------------------------------------------------ learner nested, background
    _spec(
        PERF_DP_GRADIENT_SYNC_MS_PER_RANK,
        "learner",
        "ms",
        "mean",
        _ALL,
        "Time one learner rank spends all-reducing gradients with the other ranks, inside "
        "Learning; only with more than one learner",
        kind="nested",
        parent=PERF_LEARNING_TIME,
        label="Grad Sync/rank",
    ),
    _spec(
        PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK,
        "learner",
        "count",
        "mean",
        _ALL,
        "Gradient all-reduce calls of one learner rank since the previous result (counted, "
        "averaged over the ranks); only with more than one learner",
    ),
    _spec(
        PERF_REPLAY_INGRESS_H2D_SUBMIT_MS,
        "learner",
        "ms",
        "mean",
        _SAC,
        "CPU-side duration of the latest transition submission into the device replay; runs "
        "beside the main thread and can overlap any main phase",
        kind="background",
        label="H2D Submit (bg)",
    ),
    _spec(
        PERF_LEARNER_INGEST_MS,
        "learner",
        "ms",
        "mean",
        _ALL,
        "Learner request thread resolving episode references from the object store and "
        "building batches while the learner thread trains (raylab); overlaps the main "
        "timeline",
        kind="background",
        label="Ingest (bg)",
    ),
    # ----------------------------------------------------------------------- collector (EnvRunner)
    _spec(
        PERF_COLLECTOR_MLP_INFER_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "EnvRunner's own policy forward pass per env step (RLModule inference on the EnvRunner)",
        kind="collector",
        label="MLP Infer",
    ),
    _spec(
        PERF_COLLECTOR_ENV_STEP_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "One batched env.step() call on an EnvRunner",
        kind="collector",
        label="Env Step",
    ),
    _spec(
        PERF_COLLECTOR_TRANSITION_EXTRACT_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Turning a rollout fragment's arrays into episode chunks (PPO / APPO) or flat "
        "transitions (SAC), once per fragment on raylab's rollout loop (not emitted on "
        "RLlib's EnvRunner loop)",
        kind="collector",
        label="Transition Extract",
    ),
    _spec(
        PERF_COLLECTOR_REPLAY_WRITE_MS,
        "collector",
        "ms",
        "mean",
        _SAC,
        "Packing the transitions and their bounded write towards replay (object store put)",
        kind="collector",
        label="Replay Write",
    ),
    _spec(
        PERF_COLLECTOR_METRICS_PUBLISH_MS,
        "collector",
        "ms",
        "mean",
        _SAC,
        "Publishing the collector's metrics",
        kind="collector",
        label="Metrics Publish",
    ),
    _spec(
        PERF_COLLECTION_TIME,
        "collector",
        "s",
        "mean",
        _ALL,
        "Wall time of one whole EnvRunner sample() call (one rollout fragment for every env)",
        kind="collector",
        label="Rollout Wall",
    ),
    _spec(
        PERF_COLLECTOR_ACTION_VALIDATE_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Checking / clipping the action batch, inside Env Step",
        kind="collector_nested",
        parent=PERF_COLLECTOR_ENV_STEP_MS,
        label="Action Validate",
    ),
    _spec(
        PERF_COLLECTOR_APPLY_ACTION_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Writing actions into the simulator controls, inside Env Step",
        kind="collector_nested",
        parent=PERF_COLLECTOR_ENV_STEP_MS,
        label="Apply Action",
    ),
    _spec(
        PERF_COLLECTOR_BACKEND_STEP_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Physics backend stepping (mj_step on the env threads), inside Env Step",
        kind="collector_nested",
        parent=PERF_COLLECTOR_ENV_STEP_MS,
        label="Backend Step",
    ),
    _spec(
        PERF_COLLECTOR_UPDATE_STATE_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Observation, reward and termination terms after the physics step, inside Env Step",
        kind="collector_nested",
        parent=PERF_COLLECTOR_ENV_STEP_MS,
        label="Update State",
    ),
    _spec(
        PERF_COLLECTOR_RESET_DONE_MS,
        "collector",
        "ms",
        "mean",
        _ALL,
        "Resetting the envs that finished, inside Env Step",
        kind="collector_nested",
        parent=PERF_COLLECTOR_ENV_STEP_MS,
        label="Reset Done",
    ),
    # ----------------------------------------------------------------------- algorithm loop
    _spec(
        PERF_WEIGHT_BROADCAST_MS,
        "runner",
        "ms",
        "mean",
        _ALL,
        "Algorithm side syncing fresh weights to the EnvRunners (object-store put plus the "
        "actor calls); an algorithm-loop diagnostic, not a learner main phase",
        kind="runner",
    ),
    _spec(
        PERF_EVALUATION_MS,
        "runner",
        "ms",
        "mean",
        _ALL,
        "Wall time of the evaluation reported in this iteration (its episodes on the "
        "evaluation EnvRunner; beside training, at idle priority, mostly waiting for idle "
        "cores); reported with the Eval/* tags, not a learner phase",
        kind="runner",
        label="Eval Time",
    ),
    _spec(
        PERF_ENV_RUNNER_RESTARTS,
        "runner",
        "count",
        "sum",
        _ALL,
        "EnvRunner actors restarted by fault tolerance since the run started",
    ),
    _spec(
        PERF_POLICY_STALENESS,
        "runner",
        "count",
        "mean",
        _OFF_POLICY,
        "How many weight versions the EnvRunners' policy lags the learner's when sampling",
    ),
    _spec(
        PERF_REPLAY_BUFFER_SIZE,
        "runner",
        "transitions",
        "sum",
        _SAC,
        "Transitions held in the replay buffer (summed over shards)",
    ),
    # ----------------------------------------------------------------------- families
    _spec(
        REWARD_FAMILY,
        "env_manager",
        "reward",
        "mean",
        _ALL,
        "Per-term reward diagnostic: mean over envs of raw term value x weight, before dt "
        "scaling; not an episode return",
        family_prefix="reward/",
    ),
    _spec(
        EPISODE_TERMINATION_FAMILY,
        "env_manager",
        "count",
        "sum",
        _ALL,
        "Number of reset envs for which that termination term fired; not a reward",
        family_prefix="Episode_Termination/",
    ),
    _spec(
        LOSS_FAMILY,
        "learner",
        "value",
        "mean",
        _ALL,
        "Learner loss terms (for example Loss/policy, Loss/value, Loss/entropy, Loss/critic, "
        "Loss/actor, Loss/alpha); NaN / inf are kept so divergence stays visible",
        allow_nonfinite=True,
        family_prefix="Loss/",
        member_labels=(
            ("total", "Total Loss"),
            ("policy", "Policy Loss"),
            ("value", "Value Loss"),
            ("kl", "KL Loss"),
            ("entropy", "Entropy Loss"),
            ("critic", "Critic Loss"),
            ("actor", "Actor Loss"),
            ("alpha", "Alpha Loss"),
        ),
    ),
    _spec(
        POLICY_FAMILY,
        "learner",
        "value",
        "mean",
        _ALL,
        "Policy statistics (for example Policy/entropy, Policy/kl, Policy/mean_std, "
        "Policy/alpha, Policy/grad_norm); NaN / inf are kept so divergence stays visible",
        allow_nonfinite=True,
        family_prefix="Policy/",
        member_labels=(
            ("entropy", "Entropy"),
            ("entropy_coeff", "Entropy Coef"),
            ("kl", "KL"),
            ("kl_coeff", "KL Coef"),
            ("sampling_kl", "Sampling KL"),
            ("mean_std", "Action Std"),
            ("alpha", "Alpha"),
            ("q_mean", "Q Mean"),
            ("vf_explained_var", "VF Expl Var"),
            ("importance_ratio", "IS Ratio"),
            ("advantage", "Advantage"),
            ("value_target", "Value Target"),
            ("behaviour_logp", "Behaviour LogP"),
            ("grad_norm", "Grad Norm"),
            ("learning_rate", "LR"),
        ),
    ),
)

TAGS: Dict[str, MetricSpec] = {s.name: s for s in _SPECS}
"""Every canonical tag (and tag family pattern) -> its spec."""

FAMILIES: Dict[str, MetricSpec] = {s.family_prefix: s for s in _SPECS if s.is_family}
"""Family prefix (``reward/``) -> its spec."""

LEARNER_MAIN_PHASES: Dict[str, Tuple[str, ...]] = {
    # PPO: the Learner actor's request thread; one update() call per iteration.
    "ppo": (
        PERF_LEARNER_COLLECTOR_WAIT_MS,
        PERF_LEARNER_EPISODE_TRANSFER_MS,
        PERF_LEARNER_REPLAY_STAGE_MS,
        PERF_LEARNING_TIME,
    ),
    # APPO: RLlib's learner thread; episodes are resolved and staged on the request thread
    # beside it (Perf/learner_ingest_ms, background).
    "appo": (
        PERF_LEARNER_COLLECTOR_WAIT_MS,
        PERF_LEARNER_REPLAY_SAMPLE_MS,
        PERF_LEARNING_TIME,
        PERF_LEARNER_WEIGHT_PUBLISH_MS,
    ),
    # SAC: raylab's device-replay update thread; one gradient update per iteration.
    "sac": (
        PERF_LEARNER_COLLECTOR_WAIT_MS,
        PERF_LEARNER_REPLAY_BATCH_WAIT_MS,
        PERF_LEARNER_REPLAY_SAMPLE_MS,
        PERF_LEARNING_TIME,
        PERF_LEARNER_WEIGHT_PUBLISH_MS,
    ),
}
"""Per algorithm, in timeline order, the mutually exclusive learner main-thread phases.

Only these may be added up; Other = max(``Perf/iteration_time`` - their sum, 0).
"""

COLLECTOR_CYCLE_PHASES: Dict[str, Tuple[str, ...]] = {
    "ppo": (),
    "appo": (),
    "sac": (
        PERF_COLLECTOR_MLP_INFER_MS,
        PERF_COLLECTOR_ENV_STEP_MS,
        PERF_COLLECTOR_TRANSITION_EXTRACT_MS,
        PERF_COLLECTOR_REPLAY_WRITE_MS,
        PERF_COLLECTOR_METRICS_PUBLISH_MS,
    ),
}
"""Per algorithm, the mutually exclusive per-tick collector phases whose sum is the collector
cycle (derived, never persisted). PPO and APPO report per-step averages and a whole-rollout
wall instead, which are not one breakdown, so they have no cycle."""


# ------------------------------------------------------------------------- legacy tags


def _legacy_table() -> Dict[str, LegacyRule]:
    t: Dict[str, LegacyRule] = {
        "perf/steps_per_sec": LegacyRule(PERF_TOTAL_FPS, note="summed over ranks"),
        "reward/mean_ep100": LegacyRule(
            TRAIN_MEAN_REWARD, rank=0, note="latest 100-episode mean return"
        ),
        "reward/mean": LegacyRule(
            TRAIN_MEAN_REWARD, rank=1, note="used only when reward/mean_ep100 is absent"
        ),
        "episode/timeout_rate": LegacyRule(EPISODE_TIMEOUT_RATE),
        "perf/iter_ms": LegacyRule(PERF_ITERATION_TIME, 0.001, "ms -> s"),
        "timing/learner_train_ms": LegacyRule(PERF_LEARNING_TIME, 0.001, "ms -> s"),
        "timing/learner_incremental_h2d_ms": LegacyRule(
            {"sac": PERF_REPLAY_INGRESS_H2D_SUBMIT_MS, "appo": PERF_LEARNER_REPLAY_STAGE_MS},
            note="SAC: background ingress submit; APPO: synchronous replay stage",
        ),
        "timing/replay_ingress_h2d_submit_ms": LegacyRule(PERF_REPLAY_INGRESS_H2D_SUBMIT_MS),
        "timing/collector_rollout_ms": LegacyRule(PERF_COLLECTION_TIME, 0.001, "ms -> s"),
        "train/dp_sync_time": LegacyRule(PERF_DP_GRADIENT_SYNC_MS_PER_RANK, 1000.0, "s -> ms"),
        "train/dp_gradient_sync_calls": LegacyRule(PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK),
    }
    for phase in (
        "collector_wait",
        "replay_batch_wait",
        "replay_sample",
        "weight_publish",
    ):
        t[f"timing/learner_{phase}_ms"] = LegacyRule(f"Perf/learner_{phase}_ms")
    for phase in (
        "env_step",
        "replay_write",
        "mlp_infer",
        "transition_extract",
        "metrics_publish",
        "action_validate",
        "apply_action",
        "backend_step",
        "update_state",
        "reset_done",
    ):
        t[f"timing/collector_{phase}_ms"] = LegacyRule(f"Perf/collector_{phase}_ms")
    return t


LEGACY_MIGRATION: Dict[str, LegacyRule] = _legacy_table()
"""Pre-schema tag -> how it maps to a canonical tag (with the unit conversion factor)."""

RETIRED_TAGS: Dict[str, str] = {
    "perf/effective_samples_per_sec": "derive replay rows from the config and Perf/iteration_time",
    "perf/learner_samples_per_sec": "derive replay rows from the config and Perf/iteration_time",
    "perf/collector_active_steps_per_sec": "derive from collector timings and the config",
    "perf/collector_cycle_ms": "terminal-only sum of the collector cycle phases",
    "perf/learner_*_pct": "terminal-only share of Perf/iteration_time",
    "timing/learner_other_ms": "terminal-only Other = iteration wall - main phases",
    "perf/learner_pipeline_ms": "derivable from the learner main phases",
    "Episode_Reward/*": "duplicated reward/<term> with a different meaning; use reward/<term>",
    # Learner-owned inference (the learner answers the collectors' action requests): no raylab
    # algorithm has that path (every EnvRunner runs its own policy copy), so raylab does not
    # register its tags.
    "timing/inference_total_ms": "learner-owned inference: no raylab algorithm has that path",
    "timing/inference_h2d_ms": "learner-owned inference: no raylab algorithm has that path",
    "timing/inference_forward_ms": "learner-owned inference: no raylab algorithm has that path",
    "timing/inference_d2h_ms": "learner-owned inference: no raylab algorithm has that path",
    "timing/collector_inference_wait_ms": "learner-owned inference: no raylab algorithm has it",
    "timing/learner_collector_release_ms": "learner-owned inference: no raylab algorithm has it",
    "timing/collector_inference_request_ms": "learner-owned inference: no raylab algorithm has it",
}
"""Retired tags without a replacement (``*`` matches any text) -> why / what to use instead."""


# ------------------------------------------------------------------------- family helpers


def _member(prefix: str, term: str) -> str:
    if not isinstance(term, str) or not _TERM_RE.match(term):
        raise MetricSchemaError(
            f"bad term {term!r} for family {prefix}<term>: use letters, digits, '_', '.', '-'"
        )
    tag = prefix + term
    _check_not_legacy(tag)
    return tag


def reward_tag(term: str) -> str:
    """``reward/<term>``: the per-term reward diagnostic."""
    return _member("reward/", term)


def termination_tag(term: str) -> str:
    """``Episode_Termination/<term>``: how many resets that termination term caused."""
    return _member("Episode_Termination/", term)


def loss_tag(name: str) -> str:
    """``Loss/<name>``: a learner loss term."""
    return _member("Loss/", name)


def policy_tag(name: str) -> str:
    """``Policy/<name>``: a policy statistic."""
    return _member("Policy/", name)


# ------------------------------------------------------------------------- lookups


def _retired_reason(tag: str) -> Optional[str]:
    for pattern, reason in RETIRED_TAGS.items():
        if fnmatch.fnmatchcase(tag, pattern):
            return reason
    return None


def is_legacy(tag: str) -> bool:
    """True for a recognised pre-schema tag (migrated or retired)."""
    return tag in LEGACY_MIGRATION or _retired_reason(tag) is not None


def _check_not_legacy(tag: str) -> None:
    if tag in LEGACY_MIGRATION:
        rule = LEGACY_MIGRATION[tag]
        new = (
            rule.canonical
            if isinstance(rule.canonical, str)
            else " / ".join(f"{v} ({k})" for k, v in sorted(rule.canonical.items()))
        )
        raise MetricSchemaError(f"retired legacy tag '{tag}': use '{new}'")
    reason = _retired_reason(tag)
    if reason is not None:
        raise MetricSchemaError(f"retired legacy tag '{tag}' has no replacement: {reason}")


def _stem(tag: str) -> str:
    """The tag without its unit suffix (handles ``_ms_per_rank``)."""
    tail = ""
    if tag.endswith("_per_rank"):
        tag, tail = tag[: -len("_per_rank")], "_per_rank"
    for suffix in sorted(_UNIT_SUFFIXES, key=len, reverse=True):
        if tag.endswith(suffix):
            return tag[: -len(suffix)] + tail
    # Seconds tags are named without a suffix; their stem drops '_time'.
    if tag in SECONDS_TAGS:
        return tag[: -len("_time")] + tail
    return tag + tail


_EXACT = {name: s for name, s in TAGS.items() if not s.is_family}
_STEMS: Dict[str, str] = {}
for _name in _EXACT:
    _STEMS.setdefault(_stem(_name), _name)
    if _name in SECONDS_TAGS:
        _STEMS.setdefault(_name, _name)


def lookup(tag: str) -> Optional[MetricSpec]:
    """The spec of a canonical tag or family member, or None (no legacy or unit checks)."""
    spec = _EXACT.get(tag)
    if spec is not None:
        return spec
    prefix, sep, term = tag.partition("/")
    if sep:
        fam = FAMILIES.get(prefix + "/")
        if fam is not None and _TERM_RE.match(term):
            return fam
    return None


def spec_of(tag: str) -> MetricSpec:
    """The spec of ``tag``; raises :class:`MetricSchemaError` exactly as :func:`validate` does."""
    if not isinstance(tag, str):
        raise MetricSchemaError(f"metric tag {tag!r} is not a string")
    _check_not_legacy(tag)
    spec = lookup(tag)
    if spec is None:
        raise MetricSchemaError(_unregistered_message(tag))
    if spec.is_family and spec.unit != "ms" and tag.endswith("_ms"):
        raise MetricSchemaError(
            f"tag '{tag}' has a wrong unit suffix: {spec.name} is in {UNITS[spec.unit]}, not ms"
        )
    return spec


def _unregistered_message(tag: str) -> str:
    canonical = _STEMS.get(_stem(tag))
    if canonical is not None and canonical != tag:
        unit = UNITS[TAGS[canonical].unit]
        return f"tag '{tag}' has a wrong unit suffix: the canonical tag is '{canonical}' ({unit})"
    near = difflib.get_close_matches(tag, list(_EXACT), n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    families = ", ".join(s.name for s in FAMILIES.values())
    return (
        f"unregistered metric tag '{tag}'{hint}; register it in raylab.metrics.schema "
        f"(families: {families})"
    )


def is_canonical(tag: str) -> bool:
    """True when ``tag`` is a registered tag or family member (not legacy, right unit)."""
    try:
        spec_of(tag)
    except MetricSchemaError:
        return False
    return True


# ------------------------------------------------------------------------- validation


def _to_float(tag: str, value) -> float:
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise MetricSchemaError(f"value of '{tag}' is {value!r}, not a real number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise MetricSchemaError(
            f"value of '{tag}' is a {type(value).__name__}, not a real number"
        ) from None
    return out


def normalize(metrics: Mapping[str, object]) -> Dict[str, float]:
    """Check every tag and value and return ``{tag: float}`` (fails closed).

    Accepts Python numbers, NumPy scalars and single-element tensors. Raises
    :class:`MetricSchemaError` on an unregistered tag, a wrong unit suffix, a retired legacy tag,
    a non-number, or a NaN / inf value for a tag that forbids it.
    """
    if not isinstance(metrics, Mapping):
        raise MetricSchemaError(
            f"metrics must be a mapping of tag -> value, got {type(metrics).__name__}"
        )
    out: Dict[str, float] = {}
    for tag, value in metrics.items():
        spec = spec_of(tag)
        number = _to_float(tag, value)
        if not math.isfinite(number) and not spec.allow_nonfinite:
            raise MetricSchemaError(f"value of '{tag}' is {number}; {spec.name} must be finite")
        out[tag] = number
    return out


def validate(metrics: Mapping[str, object]) -> None:
    """Raise :class:`MetricSchemaError` unless every tag and value follows the schema."""
    normalize(metrics)


def persisted_only(metrics: Mapping[str, float]) -> Dict[str, float]:
    """The subset of already validated metrics that backends write (drops terminal-only tags)."""
    return {k: v for k, v in metrics.items() if spec_of(k).persisted}


def to_seconds(tag: str, value: float) -> float:
    """A timing value in seconds, whatever the tag's unit (``_ms`` or seconds)."""
    unit = spec_of(tag).unit
    if unit == "ms":
        return float(value) / 1000.0
    if unit == "s":
        return float(value)
    raise MetricSchemaError(f"tag '{tag}' is in {UNITS[unit]}, not a time")


def learner_other_s(metrics: Mapping[str, float], algorithm: str) -> Optional[float]:
    """Terminal-only Other = max(iteration wall - sum of the main phases present, 0), seconds.

    None when the iteration wall was not measured.
    """
    if algorithm not in LEARNER_MAIN_PHASES:
        raise MetricSchemaError(
            f"unknown algorithm {algorithm!r}; valid choices: {', '.join(LEARNER_MAIN_PHASES)}"
        )
    if PERF_ITERATION_TIME not in metrics:
        return None
    accounted = sum(
        to_seconds(tag, metrics[tag]) for tag in LEARNER_MAIN_PHASES[algorithm] if tag in metrics
    )
    return max(float(metrics[PERF_ITERATION_TIME]) - accounted, 0.0)


def migrate_legacy(tag: str, algorithm: Optional[str] = None) -> Optional[Tuple[str, float]]:
    """(canonical tag, factor) for a legacy tag, None for a retired tag without a replacement.

    Raises :class:`MetricSchemaError` for a tag that is not a recognised legacy tag.
    """
    if tag in LEGACY_MIGRATION:
        rule = LEGACY_MIGRATION[tag]
        return rule.target(algorithm), rule.factor
    if _retired_reason(tag) is not None:
        return None
    raise MetricSchemaError(f"'{tag}' is not a recognised pre-schema legacy tag")


def tags_for(algorithm: str, *, kinds: Iterable[str] = KINDS) -> Tuple[str, ...]:
    """Exact (non-family) tags one algorithm emits, optionally only some kinds."""
    kinds = tuple(kinds)
    return tuple(n for n, s in _EXACT.items() if algorithm in s.algorithms and s.kind in kinds)


# ------------------------------------------------------------------------- self-check


def _check_registry() -> None:
    for spec in _SPECS:
        assert spec.owner in OWNERS, spec
        assert spec.unit in UNITS, spec
        assert spec.aggregation in AGGREGATIONS, spec
        assert spec.kind in KINDS, spec
        assert spec.algorithms <= _ALL, spec  # empty: reserved, no raylab algorithm emits it
        if spec.is_family:
            continue
        ms_name = spec.name.endswith("_ms") or spec.name.endswith("_ms_per_rank")
        assert ms_name == (spec.unit == "ms"), f"unit suffix rule broken by {spec.name}"
        assert (spec.unit == "s") == (spec.name in SECONDS_TAGS), spec.name
        if spec.parent is not None:
            assert spec.parent in _EXACT, spec
    for algo, phases in LEARNER_MAIN_PHASES.items():
        for tag in phases:
            assert TAGS[tag].kind == "main_phase" and algo in TAGS[tag].algorithms, (algo, tag)
    for name, spec in _EXACT.items():
        if spec.kind == "main_phase":
            assert all(name in LEARNER_MAIN_PHASES[a] for a in spec.algorithms), name
    for old, rule in LEGACY_MIGRATION.items():
        assert old not in _EXACT, old
        targets = [rule.canonical] if isinstance(rule.canonical, str) else rule.canonical.values()
        for target in targets:
            assert target in _EXACT, (old, target)


_check_registry()
