"""The live terminal panel of the driver process (rich Live, Table, Panel).

One panel for every algorithm. The Tune callback hands it one canonical metric dict per training
iteration (already reduced across EnvRunners and Learners); the panel keeps the samples of the
last two seconds and redraws on a fixed 2 Hz clock, each value being the mean of the samples in
that window (the header says how many: ``Avg 2s (n=...)``). A value no sample in the window
carries keeps its last value; when no sample is that recent the header says how old the newest
one is.

Layout by terminal width (labels are never cut; numbers lose precision first):

- below 96 columns: metrics, rewards and timing stacked; timing is one column with short headers;
- 96 to 119 columns: metrics and rewards side by side; timing in compact Learner / Collector
  columns, system facts below them;
- 120 columns and more: metrics and rewards side by side; three timing columns, Learner (Iter
  Wall is 100%), Collector (its own clock) and System.

When stdout is not a terminal (``ray job submit`` logs, CI) there is no redraw: one compact
progress line every few seconds. ``TerminalReporter.close()`` stops the redraw (also after
Ctrl-C) and prints a final summary. docs/terminal.md shows each layout and explains every row.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

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


@dataclass(frozen=True)
class Snapshot:
    """What one frame shows: window means and the job's progress at time ``now``."""

    values: Dict[str, float]
    n: int
    age_s: Optional[float]
    iteration: int
    env_steps: int
    elapsed_s: float


def tier_of(width: int) -> str:
    if width >= WIDE_WIDTH:
        return "wide"
    if width >= COMPACT_WIDTH:
        return "compact"
    return "narrow"


class TerminalPanel:
    """Samples in, a rich renderable out. Thread-safe: samples arrive on Tune's thread while the
    live display renders on its own refresh thread."""

    def __init__(self, system: SystemInfo, window_s: float = WINDOW_S):
        self.system = system
        self._window = SampleWindow(window_s)
        self._lock = threading.Lock()
        self.iteration = 0
        self.env_steps = 0
        self.samples = 0
        self.best_reward: Optional[float] = None
        self.last_eval: Dict[str, float] = {}  # the latest evaluation's Eval/* values
        self.best_eval: Optional[float] = None
        self._time_total_s = 0.0
        self._last_t: Optional[float] = None

    @property
    def window_s(self) -> float:
        return self._window.window_s

    def add_sample(
        self,
        metrics: Mapping[str, float],
        t: float,
        *,
        iteration: Optional[int] = None,
        env_steps: Optional[int] = None,
        time_total_s: Optional[float] = None,
    ) -> None:
        """One canonical metric dict (tag -> float) that arrived at clock time ``t``."""
        with self._lock:
            self._window.add(metrics, t)
            self.samples += 1
            self.iteration = int(iteration) if iteration is not None else self.iteration + 1
            if env_steps is not None:
                self.env_steps = int(env_steps)
            if time_total_s is not None:
                self._time_total_s = float(time_total_s)
            elif self._last_t is not None:
                self._time_total_s += t - self._last_t
            self._last_t = t
            reward = metrics.get(S.TRAIN_MEAN_REWARD)
            if (
                reward is not None
                and math.isfinite(reward)
                and (self.best_reward is None or reward > self.best_reward)
            ):
                self.best_reward = reward
            evals = {k: v for k, v in metrics.items() if k in EVAL_TAGS}
            if evals:
                self.last_eval = evals
                score = evals.get(S.EVAL_MEAN_REWARD)
                if score is not None and (self.best_eval is None or score > self.best_eval):
                    self.best_eval = score

    def snapshot(self, now: float) -> Snapshot:
        with self._lock:
            values, n, age = self._window.mean(now)
            values = {**{k: v for k, v in values.items() if k not in EVAL_TAGS}, **self.last_eval}
            elapsed = self._time_total_s + (now - self._last_t if self._last_t is not None else 0.0)
            return Snapshot(values, n, age, self.iteration, self.env_steps, elapsed)

    # ---- rendering ---------------------------------------------------------------------------
    def render(self, width: int, now: float) -> Panel:
        """The panel for a terminal ``width`` columns wide at clock time ``now``."""
        return render_panel(self.system, self.snapshot(now), width, self.window_s)


def _window_label(snap: Snapshot, window_s: float) -> str:
    label = f"Avg {window_s:g}s (n={snap.n})"
    if snap.n == 0 and snap.age_s is not None:
        label = f"Avg {window_s:g}s (n=0, last {snap.age_s:.1f}s ago)"
    return label


def _header(system: SystemInfo, snap: Snapshot, width: int, window_s: float, sig: int) -> Text:
    """Header fields packed greedily into lines; a field is never split."""
    values = snap.values
    fields = [
        Text.assemble((system.algo.upper(), "bold"), " · ", system.task),
        Text.assemble(("Iter ", "dim"), f"{snap.iteration:,}"),
        Text.assemble(("Steps ", "dim"), f"{snap.env_steps:,}"),
        Text.assemble(("Elapsed ", "dim"), fmt_duration(snap.elapsed_s)),
        Text.assemble(("Steps/s ", "dim"), (fmt_number(values.get(S.PERF_TOTAL_FPS), sig), "bold")),
        Text.assemble(
            ("Rows/s ", "dim"), (fmt_number(values.get(S.PERF_LEARNER_ROWS_PER_S), sig), "bold")
        ),
        Text(_window_label(snap, window_s), style="cyan"),
    ]
    gap = "   "
    lines: List[Text] = []
    for field in fields:
        if lines and len(lines[-1]) + len(gap) + len(field) <= width:
            lines[-1].append(gap)
            lines[-1].append_text(field)
        else:
            lines.append(field.copy())
    return Text("\n").join(lines)


def _kv_table(title: str, rows: Sequence[Tuple[str, str]], width: int) -> Table:
    """Label / value pairs, packed into as many side-by-side pairs (at most 3) as ``width``
    allows, filled top to bottom."""
    rows = list(rows) or [("-", "")]
    label_w = max(len(k) for k, _ in rows)
    pair_w = label_w + max(len(v) for _, v in rows) + 4
    pairs = max(1, min(3, width // pair_w, len(rows)))
    height = math.ceil(len(rows) / pairs)
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    for i in range(pairs):
        table.add_column(title if i == 0 else "", no_wrap=True, min_width=label_w)
        table.add_column("", justify="right", no_wrap=True)
    for r in range(height):
        cells: List[str] = []
        for i in range(pairs):
            k = r + i * height
            cells += list(rows[k]) if k < len(rows) else ["", ""]
        table.add_row(*cells)
    return table


def _timing_cells(row: TimingRow, sig: int, pct_digits: int) -> Tuple[Text, str, str]:
    label = Text("  " * row.indent + row.label, style=row.style)
    ms = fmt_number(row.ms, sig) if row.ms is not None else "-"
    pct = f"{row.pct:.{pct_digits}f}" if row.pct is not None else ""
    return label, ms, pct


def _timing_table(
    title: str, rows: Sequence[TimingRow], with_pct: bool, sig: int, pct_digits: int
) -> Table:
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column(
        title,
        no_wrap=True,
        min_width=max([len(title)] + [len(r.label) + 2 * r.indent for r in rows]),
    )
    table.add_column("ms", justify="right", no_wrap=True)
    if with_pct:
        table.add_column("%", justify="right", no_wrap=True)
    for row in rows or [TimingRow("-", None)]:
        cells = _timing_cells(row, sig, pct_digits)
        table.add_row(*(cells if with_pct else cells[:2]), style=row.style)
    return table


def _single_timing_table(
    learner: Sequence[TimingRow], collector: Sequence[TimingRow], sig: int, pct_digits: int
) -> Table:
    """Narrow tier: learner and collector rows in one column, short section headers."""
    rows = list(learner) + list(collector)
    table = Table(box=None, padding=(0, 1), pad_edge=False, show_header=False)
    table.add_column(no_wrap=True, min_width=max([9] + [len(r.label) + 2 * r.indent for r in rows]))
    table.add_column(justify="right", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    for title, section in (("Learner", learner), ("Collector", collector)):
        with_pct = any(r.pct is not None for r in section)
        table.add_row(
            Text(title, style="bold"),
            Text("ms", style="bold"),
            Text("%" if with_pct else "", style="bold"),
        )
        for row in section or [TimingRow("-", None)]:
            table.add_row(*_timing_cells(row, sig, pct_digits), style=row.style)
    return table


def _side_by_side(*items: RenderableType) -> Table:
    grid = Table.grid(expand=True, padding=(0, 3))
    for _ in items:
        grid.add_column(ratio=1)
    grid.add_row(*items)
    return grid


def render_panel(
    system: SystemInfo, snap: Snapshot, width: int, window_s: float = WINDOW_S
) -> Panel:
    """The whole panel for one snapshot at a terminal ``width``."""
    tier = tier_of(width)
    inner = max(width - 4, 20)  # border and padding
    sig = 4 if tier != "narrow" else 3
    pct_digits = 1 if width >= 64 else 0
    values = snap.values

    metrics = [(k, fmt_number(v, sig)) for k, v in metric_rows(values)]
    rewards = [(k, fmt_number(v, sig)) for k, v in reward_rows(values)]
    learner = learner_rows(values, system.algo)
    collector = collector_rows(values, system.algo)
    system_kv = system_rows(values, system, sig)
    collector_pct = collector_has_cycle(system.algo)

    header = _header(system, snap, inner, window_s, sig)
    if tier == "narrow":
        body: List[RenderableType] = [
            header,
            "",
            _kv_table("Metrics", metrics, inner),
            "",
            _kv_table("Rewards", rewards, inner),
            "",
            _single_timing_table(learner, collector, sig, pct_digits),
            "",
            _kv_table("System", system_kv, inner),
        ]
    else:
        half = (inner - 3) // 2
        top = _side_by_side(
            _kv_table("Metrics", metrics, half), _kv_table("Rewards", rewards, half)
        )
        if tier == "compact":
            timing = _side_by_side(
                _timing_table("Learner", learner, True, sig, pct_digits),
                _timing_table("Collector", collector, collector_pct, sig, pct_digits),
            )
            body = [header, "", top, "", timing, "", _kv_table("System", system_kv, inner)]
        else:
            timing = _side_by_side(
                _timing_table("Learner (Iter Wall)", learner, True, sig, pct_digits),
                _timing_table("Collector (own clock)", collector, collector_pct, sig, pct_digits),
                _kv_table("System", system_kv, (inner - 6) // 3),
            )
            body = [header, "", top, "", timing]
    title = Text.assemble(("raylab", "bold"), f" · GPUs {system.gpus:g}")
    return Panel(
        Group(*body), title=title, title_align="left", box=box.ROUNDED, width=width, padding=(0, 1)
    )


# ------------------------------------------------------------------------------ plain line


def progress_line(snap: Snapshot) -> str:
    """One compact progress line (no live redraw): iteration, env steps, Steps/s, mean reward,
    iteration wall, elapsed."""
    values = snap.values
    reward = values.get(S.TRAIN_MEAN_REWARD)
    wall = values.get(S.PERF_ITERATION_TIME)
    score = values.get(S.EVAL_MEAN_REWARD)
    return (
        f"raylab iter {snap.iteration:,}  steps {snap.env_steps:,}  "
        f"Steps/s {fmt_number(values.get(S.PERF_TOTAL_FPS))}  "
        f"reward {fmt_number(reward)}  "
        + (f"eval {fmt_number(score)}  " if score is not None else "")
        + f"iter_wall {f'{wall:.2f}s' if wall is not None else '-'}  "
        f"elapsed {fmt_duration(snap.elapsed_s)}"
    )


def summary_line(panel: TerminalPanel, now: float) -> str:
    """The final summary printed when the reporter closes."""
    snap = panel.snapshot(now)
    if panel.samples == 0:
        return "raylab: no training iteration completed"
    rate = snap.env_steps / snap.elapsed_s if snap.elapsed_s > 0 else None
    reward = snap.values.get(S.TRAIN_MEAN_REWARD)
    best = panel.best_reward
    return (
        f"raylab: {snap.iteration:,} iterations, {snap.env_steps:,} env steps in "
        f"{fmt_duration(snap.elapsed_s)} ({fmt_number(rate)} steps/s overall); "
        f"mean reward {fmt_number(reward)} (best {fmt_number(best)})"
        + (
            f"; eval {fmt_number(panel.last_eval.get(S.EVAL_MEAN_REWARD))} "
            f"(best {fmt_number(panel.best_eval)})"
            if panel.best_eval is not None
            else ""
        )
    )


# ------------------------------------------------------------------------------ the reporter


def resolve_mode(mode: str, console: Console) -> str:
    """auto -> live on a terminal, plain otherwise; other modes as given."""
    if mode not in MODES:
        raise ValueError(f"training.terminal={mode!r}; valid choices: {', '.join(MODES)}")
    if mode == "auto":
        return "live" if console.is_terminal and not console.is_dumb_terminal else "plain"
    return mode


class TerminalReporter:
    """The driver's ``progress(trial, result, metrics)`` callable (see RaylabTuneCallback).

    Modes: ``live`` redraws the panel at ``refresh_hz`` from rich's refresh thread (started on
    the first sample); ``plain`` prints :func:`progress_line` at most every ``plain_every_s``
    seconds; ``off`` shows nothing. Call :meth:`close` when training ends, also on Ctrl-C: it
    stops the redraw, leaves the last frame on screen and prints a summary line.

    Pickling (Tune saves its callbacks) keeps only the configuration; an unpickled reporter, as
    in a resumed experiment, prints plain lines, which need no close().
    """

    def __init__(
        self,
        system: SystemInfo,
        mode: str = "auto",
        *,
        console: Optional[Console] = None,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
        refresh_hz: float = REFRESH_HZ,
        plain_every_s: float = PLAIN_EVERY_S,
    ):
        self.console = console if console is not None else Console()
        self.mode = resolve_mode(mode, self.console)
        self.clock = clock
        self.refresh_hz = refresh_hz
        self.plain_every_s = plain_every_s
        self.panel = TerminalPanel(system, window_s)
        self._live: Optional[Live] = None
        self._last_line: Optional[float] = None
        self._closed = False

    def __getstate__(self):
        return {
            "system": self.panel.system,
            "mode": "off" if self.mode == "off" else "plain",
            "window_s": self.panel.window_s,
            "plain_every_s": self.plain_every_s,
        }

    def __setstate__(self, state):
        self.__init__(**state)

    def __call__(self, trial, result: Mapping, metrics: Mapping[str, float]) -> None:
        from raylab.reporting import env_steps

        now = self.clock()
        self.panel.add_sample(
            metrics,
            now,
            iteration=result.get("training_iteration"),
            env_steps=env_steps(dict(result)),
            time_total_s=result.get("time_total_s"),
        )
        if self._closed or self.mode == "off":
            return
        if self.mode == "live":
            if self._live is None:
                self._start_live()
        elif self._last_line is None or now - self._last_line >= self.plain_every_s:
            self._last_line = now
            self._print(progress_line(self.panel.snapshot(now)))

    def _frame(self) -> RenderableType:
        try:
            return self.panel.render(self.console.width, self.clock())
        except Exception as e:  # a display bug must not freeze the panel thread
            return Text(f"raylab panel error: {type(e).__name__}: {e}", style="red")

    def _start_live(self) -> None:
        self._live = Live(
            get_renderable=self._frame,
            console=self.console,
            refresh_per_second=self.refresh_hz,
            transient=False,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start(refresh=True)

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Stop the live redraw (the last frame stays) and print the summary. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()
        if self.mode != "off":
            self._print(summary_line(self.panel, self.clock()))


def make_reporter(
    config: Mapping,
    num_gpus_per_learner: float = 0.0,
    *,
    mode: Optional[str] = None,
    console: Optional[Console] = None,
    clock: Callable[[], float] = time.monotonic,
) -> TerminalReporter:
    """The reporter for a composed config dict; ``mode`` defaults to ``training.terminal``."""
    system = SystemInfo.from_config(config, num_gpus_per_learner)
    if mode is None:
        mode = str(config.get("training", {}).get("terminal", "auto"))
    return TerminalReporter(system, mode, console=console, clock=clock)


# ------------------------------------------------------------------------------ example frames


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


if __name__ == "__main__":
    raise SystemExit(_main())
