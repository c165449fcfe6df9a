"""The panel: the latest samples and their 2 s window, the width tiers, the rich layout, and
the one-line forms (progress line, summary)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from raylab.metrics import schema as S
from raylab.terminal.rows import (
    COMPACT_WIDTH,
    EVAL_TAGS,
    WIDE_WIDTH,
    WINDOW_S,
    SampleWindow,
    SystemInfo,
    TimingRow,
    collector_has_cycle,
    collector_rows,
    fmt_duration,
    fmt_number,
    learner_rows,
    metric_rows,
    reward_rows,
    system_rows,
)


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
