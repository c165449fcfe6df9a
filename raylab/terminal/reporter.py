"""The reporter the Tune callback feeds: live panel on a terminal, progress lines elsewhere,
the summary at the end."""

from __future__ import annotations

import time
from typing import Callable, Mapping, Optional

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from raylab.terminal.render import (
    TerminalPanel,
    progress_line,
    summary_line,
)
from raylab.terminal.rows import (
    MODES,
    PLAIN_EVERY_S,
    REFRESH_HZ,
    WINDOW_S,
    SystemInfo,
)


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
