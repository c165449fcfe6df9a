"""The panel's rows: labels (from the schema), system facts, the sample window, number
formats, and the learner / collector / system / metric / reward rows."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from raylab.metrics import schema as S

WINDOW_S = 2.0  # the sliding window every displayed value is averaged over
REFRESH_HZ = 2.0  # redraw clock of the live panel
PLAIN_EVERY_S = 5.0  # at most one progress line this often when not on a terminal
COMPACT_WIDTH = 96  # from here metrics and rewards share a row, timing has two columns
WIDE_WIDTH = 120  # from here timing has three columns: Learner, Collector, System
QUIET_SHARE = 0.01  # quiet collector diagnostics show only above this share of their basis
MODES = ("auto", "live", "plain", "off")

# ------------------------------------------------------------------------------ labels
# Every timing row's label is its schema entry's ``label`` (tests check that every timing tag
# has one); Loss/<name> and Policy/<name> show their family's ``member_labels`` first, in that
# order, then the other members by name.

_TIMING_KINDS = ("main_phase", "wall", "nested", "background")
LEARNER_LABELS: Dict[str, str] = {
    t: spec.label for t, spec in S.TAGS.items() if spec.kind in _TIMING_KINDS and spec.label
}
COLLECTOR_LABELS: Dict[str, str] = {
    t: spec.label
    for t, spec in S.TAGS.items()
    if spec.kind in ("collector", "collector_nested") and spec.label
}
OTHER_LABEL = "Other"
ACCOUNTED_LABEL = "Accounted > Wall"

CYCLE_LABEL = "Cycle"
# Collector cycle phases that are quiet diagnostics: shown only above QUIET_SHARE of the cycle.
QUIET_CYCLE_PHASES = (
    S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS,
    S.PERF_COLLECTOR_METRICS_PUBLISH_MS,
)

LOSS_LABELS: Dict[str, str] = dict(S.TAGS[S.LOSS_FAMILY].member_labels)
POLICY_LABELS: Dict[str, str] = dict(S.TAGS[S.POLICY_FAMILY].member_labels)

_REWARD_PREFIX = S.TAGS[S.REWARD_FAMILY].family_prefix
_LOSS_PREFIX = S.TAGS[S.LOSS_FAMILY].family_prefix
EVAL_TAGS = (S.EVAL_MEAN_REWARD, S.EVAL_MEAN_EPISODE_LENGTH, S.EVAL_SURVIVAL, S.PERF_EVALUATION_MS)
_POLICY_PREFIX = S.TAGS[S.POLICY_FAMILY].family_prefix


# ------------------------------------------------------------------------------ system facts


@dataclass(frozen=True)
class SystemInfo:
    """What the job runs on; taken from the composed config, not from the metrics."""

    algo: str
    task: str
    runners: int
    envs_per_runner: int
    learners: int  # configured num_learners (0: the learner runs inside the algorithm actor)
    gpus_per_learner: float = 0.0

    @classmethod
    def from_config(cls, config: Mapping, num_gpus_per_learner: float = 0.0) -> "SystemInfo":
        """From the composed config dict (``to_dict(cfg)``) and the resolved GPUs per learner."""
        return cls(
            algo=str(config["algo"]["name"]),
            task=str(config["task"]),
            runners=int(config["resources"]["num_env_runners"]),
            envs_per_runner=int(config["env"]["num_envs"]),
            learners=int(config["resources"]["num_learners"]),
            gpus_per_learner=float(num_gpus_per_learner or 0.0),
        )

    @property
    def envs(self) -> int:
        # num_env_runners=0 samples in the algorithm actor: still one set of envs.
        return self.envs_per_runner * max(1, self.runners)

    @property
    def gpus(self) -> float:
        return self.gpus_per_learner * max(1, self.learners)

    @property
    def devices(self) -> str:
        n = max(1, self.learners)
        if self.gpus_per_learner <= 0:
            return f"{n} CPU"
        if self.gpus_per_learner == 1:
            return f"{n} GPU"
        return f"{n} x {self.gpus_per_learner:g} GPU"


# ------------------------------------------------------------------------------ sample window


class SampleWindow:
    """Canonical metric samples with timestamps; the mean over the last ``window_s`` seconds.

    Not thread-safe on its own; :class:`TerminalPanel` guards it with a lock.
    """

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = float(window_s)
        self._samples: deque = deque()
        self._last: Dict[str, float] = {}  # tag -> its value in the newest sample that had it

    def add(self, metrics: Mapping[str, float], t: float) -> None:
        self._samples.append((float(t), dict(metrics)))
        self._last.update(metrics)
        # A sample older than the window before the newest can never be in a window again.
        while self._samples[0][0] < t - self.window_s:
            self._samples.popleft()

    def mean(self, now: float) -> Tuple[Dict[str, float], int, Optional[float]]:
        """(values, number of samples at most ``window_s`` old, age of the newest sample).

        A tag's value is its mean over the samples in the window that have it. A tag that no
        sample in the window has (an iteration without a learner result, or no sample recent
        enough) keeps its last value. The age is None before the first sample.
        """
        if not self._samples:
            return {}, 0, None
        recent = [m for t, m in self._samples if now - t <= self.window_s]
        sums: Dict[str, float] = {}
        counts: Dict[str, int] = {}
        for sample in recent:
            for tag, value in sample.items():
                sums[tag] = sums.get(tag, 0.0) + value
                counts[tag] = counts.get(tag, 0) + 1
        values = dict(self._last)
        values.update({tag: sums[tag] / counts[tag] for tag in sums})
        return values, len(recent), now - self._samples[-1][0]


# ------------------------------------------------------------------------------ formatting


def fmt_number(x: Optional[float], sig: int = 4) -> str:
    """About ``sig`` significant digits, thousands separators, never scientific above 1e-3."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if mag >= sig - 1:
        return f"{x:,.0f}"
    if mag < -3:
        return f"{x:.{max(sig - 2, 0)}e}"
    return f"{x:.{sig - 1 - mag}f}"


def fmt_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _ms(tag: str, value: float) -> float:
    return S.to_seconds(tag, value) * 1000.0


def _family_label(tag: str, prefix: str, known: Mapping[str, str], suffix: str = "") -> str:
    name = tag[len(prefix) :]
    if name in known:
        return known[name]
    return " ".join(w.capitalize() for w in name.replace("-", "_").split("_") if w) + suffix


def _family_rows(
    values: Mapping[str, float], prefix: str, known: Mapping[str, str], suffix: str = ""
) -> List[Tuple[str, float]]:
    order = {name: i for i, name in enumerate(known)}
    tags = [t for t in values if t.startswith(prefix) and S.lookup(t) is S.FAMILIES[prefix]]
    tags.sort(key=lambda t: (order.get(t[len(prefix) :], len(order)), t))
    return [(_family_label(t, prefix, known, suffix), values[t]) for t in tags]


# ------------------------------------------------------------------------------ rows


@dataclass(frozen=True)
class TimingRow:
    """One timing row: label, milliseconds, share in percent (None: not a share), style."""

    label: str
    ms: Optional[float]
    pct: Optional[float] = None
    indent: int = 0
    style: str = ""


def learner_rows(values: Mapping[str, float], algo: str) -> List[TimingRow]:
    """Main phases in timeline order (nested rows under their parent), Other, Iter Wall,
    then background rows. Only main phases and Other are shares of Iter Wall."""
    wall = values.get(S.PERF_ITERATION_TIME)
    wall_ms = wall * 1000.0 if wall is not None else None

    def share(ms: float) -> Optional[float]:
        return 100.0 * ms / wall_ms if wall_ms else None

    def indented(tag: str) -> TimingRow:  # nested or background: milliseconds only
        return TimingRow(LEARNER_LABELS[tag], _ms(tag, values[tag]), indent=1, style="dim")

    phases = [t for t in S.LEARNER_MAIN_PHASES[algo] if t in values]
    nested = [t for t in S.tags_for(algo, kinds=("nested",)) if t in values]
    rows: List[TimingRow] = []
    accounted = 0.0
    for tag in phases:
        ms = _ms(tag, values[tag])
        accounted += ms
        rows.append(TimingRow(LEARNER_LABELS[tag], ms, share(ms)))
        rows += [indented(child) for child in nested if S.spec_of(child).parent == tag]
    rows += [indented(child) for child in nested if S.spec_of(child).parent not in phases]
    other = S.learner_other_s(values, algo)
    if wall_ms is not None:
        rows.append(TimingRow(OTHER_LABEL, other * 1000.0, share(other * 1000.0)))
        rows.append(TimingRow(LEARNER_LABELS[S.PERF_ITERATION_TIME], wall_ms, 100.0, style="bold"))
        if wall_ms and accounted > wall_ms * 1.0005:  # timers overlap: a bug, not parallel work
            rows.append(TimingRow(ACCOUNTED_LABEL, accounted, share(accounted), style="bold red"))
    rows += [indented(t) for t in S.tags_for(algo, kinds=("background",)) if t in values]
    return rows


def collector_has_cycle(algo: str) -> bool:
    return bool(S.COLLECTOR_CYCLE_PHASES[algo])


def collector_rows(values: Mapping[str, float], algo: str) -> List[TimingRow]:
    """The collector's own clock, never added to the learner's.

    With cycle phases (SAC): each phase as a share of their sum, the cycle; quiet phases and the
    nested env-step details only above 1% of the cycle. Without (PPO, APPO): per-step times and
    the rollout wall in milliseconds, no shares; nested details only above 1% of Env Step.
    """
    nested = [t for t in S.tags_for(algo, kinds=("collector_nested",)) if t in values]
    cycle_phases = [t for t in S.COLLECTOR_CYCLE_PHASES[algo] if t in values]
    cycle_ms = sum(_ms(t, values[t]) for t in cycle_phases)
    rows: List[TimingRow] = []

    def add_children(parent: str, basis_ms: float, with_share: bool) -> None:
        for child in nested:
            if S.spec_of(child).parent != parent:
                continue
            ms = _ms(child, values[child])
            if basis_ms > 0 and ms / basis_ms > QUIET_SHARE:
                pct = 100.0 * ms / basis_ms if with_share else None
                rows.append(TimingRow(COLLECTOR_LABELS[child], ms, pct, indent=1, style="dim"))

    if cycle_phases:
        for tag in cycle_phases:
            ms = _ms(tag, values[tag])
            quiet = tag in QUIET_CYCLE_PHASES
            if not quiet or (cycle_ms > 0 and ms / cycle_ms > QUIET_SHARE):
                pct = 100.0 * ms / cycle_ms if cycle_ms > 0 else None
                rows.append(TimingRow(COLLECTOR_LABELS[tag], ms, pct))
            add_children(tag, cycle_ms, with_share=True)
        rows.append(TimingRow(CYCLE_LABEL, cycle_ms, 100.0 if cycle_ms > 0 else None, style="bold"))
    else:
        for tag in S.tags_for(algo, kinds=("collector",)):
            if tag in values and tag != S.PERF_COLLECTION_TIME:
                ms = _ms(tag, values[tag])
                rows.append(TimingRow(COLLECTOR_LABELS[tag], ms))
                add_children(tag, ms, with_share=False)
    if S.PERF_COLLECTION_TIME in values:
        rows.append(
            TimingRow(
                COLLECTOR_LABELS[S.PERF_COLLECTION_TIME],
                _ms(S.PERF_COLLECTION_TIME, values[S.PERF_COLLECTION_TIME]),
            )
        )
    return rows


def system_rows(
    values: Mapping[str, float], system: SystemInfo, sig: int = 4
) -> List[Tuple[str, str]]:
    learners = str(system.learners) if system.learners > 0 else "1 (local)"
    rows = [
        ("Envs", f"{system.envs:,}"),
        ("Envs/Runner", f"{system.envs_per_runner:,}"),
        ("Runners", f"{system.runners:,}"),
        ("Learners", learners),
        ("Devices", system.devices),
    ]
    if S.PERF_REPLAY_BUFFER_SIZE in S.tags_for(system.algo) or S.PERF_REPLAY_BUFFER_SIZE in values:
        size = values.get(S.PERF_REPLAY_BUFFER_SIZE)
        rows.append(("Buffer", f"{size:,.0f}" if size is not None else "-"))
    timeout = values.get(S.EPISODE_TIMEOUT_RATE)
    rows.append(("Timeout", f"{100.0 * timeout:.1f}%" if timeout is not None else "-"))
    if S.PERF_LEARNER_UPDATES_PER_S in values:
        rows.append(("Updates/s", fmt_number(values[S.PERF_LEARNER_UPDATES_PER_S], sig)))
    if S.PERF_POLICY_STALENESS in values:
        rows.append(("Staleness", fmt_number(values[S.PERF_POLICY_STALENESS], sig)))
    if S.PERF_WEIGHT_BROADCAST_MS in values:
        rows.append(("Weight Sync", fmt_number(values[S.PERF_WEIGHT_BROADCAST_MS], sig) + " ms"))
    if S.PERF_EVALUATION_MS in values:
        rows.append(("Eval Time", fmt_number(values[S.PERF_EVALUATION_MS] / 1000.0, sig) + " s"))
    if values.get(S.PERF_ENV_RUNNER_RESTARTS, 0) > 0:
        rows.append(("Restarts", f"{values[S.PERF_ENV_RUNNER_RESTARTS]:,.0f}"))
    return rows


def metric_rows(values: Mapping[str, float]) -> List[Tuple[str, Optional[float]]]:
    rows: List[Tuple[str, Optional[float]]] = [
        ("Mean Reward", values.get(S.TRAIN_MEAN_REWARD)),
        ("Ep Length", values.get(S.TRAIN_MEAN_EPISODE_LENGTH)),
    ]
    # The latest evaluation (it runs every training.eval_every iterations, so it is shown as
    # last reported rather than averaged over the panel's window).
    for tag, label in ((S.EVAL_MEAN_REWARD, "Eval Reward"), (S.EVAL_SURVIVAL, "Eval Survival")):
        if tag in values:
            rows.append((label, values[tag]))
    rows += _family_rows(values, _LOSS_PREFIX, LOSS_LABELS, suffix=" Loss")
    rows += _family_rows(values, _POLICY_PREFIX, POLICY_LABELS)
    return rows


def reward_rows(values: Mapping[str, float]) -> List[Tuple[str, float]]:
    """Every reward/<term> (label: the term) with its mean, by term name."""
    tags = sorted(
        t
        for t in values
        if t.startswith(_REWARD_PREFIX) and S.lookup(t) is S.FAMILIES[_REWARD_PREFIX]
    )
    return [(t[len(_REWARD_PREFIX) :], values[t]) for t in tags]


# ------------------------------------------------------------------------------ the panel
