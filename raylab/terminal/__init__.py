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

Modules: :mod:`~raylab.terminal.rows` (labels from the schema, the sample window, the rows),
:mod:`~raylab.terminal.render` (the panel and its layouts, progress and summary lines),
:mod:`~raylab.terminal.reporter` (what the Tune callback feeds) and
:mod:`~raylab.terminal.examples` (frames from samples recorded in real runs;
``python -m raylab.terminal``).
"""

from raylab.terminal.examples import example_panel, example_samples
from raylab.terminal.render import (
    Snapshot,
    TerminalPanel,
    progress_line,
    render_panel,
    summary_line,
    tier_of,
)
from raylab.terminal.reporter import TerminalReporter, make_reporter, resolve_mode
from raylab.terminal.rows import (
    ACCOUNTED_LABEL,
    COLLECTOR_LABELS,
    CYCLE_LABEL,
    LEARNER_LABELS,
    LOSS_LABELS,
    OTHER_LABEL,
    POLICY_LABELS,
    SampleWindow,
    SystemInfo,
    TimingRow,
    collector_rows,
    fmt_duration,
    fmt_number,
    learner_rows,
    metric_rows,
    reward_rows,
    system_rows,
)

__all__ = [
    "ACCOUNTED_LABEL",
    "COLLECTOR_LABELS",
    "CYCLE_LABEL",
    "LEARNER_LABELS",
    "LOSS_LABELS",
    "OTHER_LABEL",
    "POLICY_LABELS",
    "SampleWindow",
    "Snapshot",
    "SystemInfo",
    "TerminalPanel",
    "TerminalReporter",
    "TimingRow",
    "collector_rows",
    "example_panel",
    "example_samples",
    "fmt_duration",
    "fmt_number",
    "learner_rows",
    "make_reporter",
    "metric_rows",
    "progress_line",
    "render_panel",
    "resolve_mode",
    "reward_rows",
    "summary_line",
    "system_rows",
    "tier_of",
]
