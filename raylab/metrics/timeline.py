"""Phase timers for learner and collector loops, and their transport through RLlib's metrics.

A ``Timeline`` measures one thread's loop: mutually exclusive phases inside an iteration and the
iteration's wall time (from one iteration boundary to the next). Phases it does not name are
what the terminal calls Other (wall - accounted, never negative).

Timings and statistics travel from Ray actors to the driver as *partial states* of the raylab
stats tracker (exact sums, counts, minima, maxima). Each actor logs its tracker's export into
RLlib's ``MetricsLogger`` as one item of an ``item_series`` under ``raylab/<tracker>``; RLlib's
aggregation across EnvRunners and Learners concatenates the items, and the driver merges them
with ``tracker.merge_exports``, which gives the numbers one tracker fed all the data would.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator, Optional, Tuple

from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics import tracker as stats_tracker

RAYLAB_KEY = "raylab"
LEARNER_TRACKER = "learner"  # in Learner actors
COLLECTOR_TRACKER = "collector"  # in EnvRunner actors
EVAL_TRACKER = "eval"  # in evaluation EnvRunners: the Eval/* tags


def push_partial_state(metrics_logger, tracker_name: str) -> None:
    """Export (and reset) a tracker of this process into an RLlib MetricsLogger."""
    exported = stats_tracker.get(tracker_name).export(reset=True)
    if exported:
        metrics_logger.log_value((RAYLAB_KEY, tracker_name), exported, reduce="item_series")


def pull_final_stats(result: dict, where: str, tracker_name: str) -> Dict[str, float]:
    """Final numbers of a tracker merged across every actor that reported in this result."""
    items = result.get(where, {}).get(RAYLAB_KEY, {}).get(tracker_name, [])
    if isinstance(items, dict):  # RLlib hands a lone item over unwrapped
        items = [items]
    items = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
    if not items:
        return {}
    merged = stats_tracker.drop_counts(stats_tracker.merge_exports(items))
    prefix = tracker_name + "/"
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in merged.items()}


def label(tag: str) -> str:
    """The schema's short label of a canonical tag (a trace event's name)."""
    spec = S.TAGS.get(tag)
    return spec.label if spec is not None and spec.label else tag


def to_unit(tag: str, seconds: float) -> float:
    """Seconds in the unit of a canonical tag: milliseconds for ``_ms`` tags, else seconds."""
    return seconds * 1000.0 if tag.endswith("_ms") else seconds


class Timeline:
    """Mutually exclusive phases of one loop, plus the loop's iteration wall time.

    ``boundary()`` ends the current iteration (if one is open) and starts the next; it returns
    the closed iteration as {phase: seconds, "wall": seconds}. ``phase(name)`` times a block
    inside the open iteration. Calls from threads other than the owner are ignored by
    ``phase`` (use ``background`` for work on other threads).

    With tracing on (:mod:`raylab.metrics.trace`) every iteration, phase occurrence and
    background block is also one trace event, named by the tag's schema label.
    """

    def __init__(
        self,
        tracker_name: str,
        phases: Tuple[str, ...],
        wall_tag: str,
        owner: Optional[threading.Thread] = None,
    ):
        self.tracker = stats_tracker.get(tracker_name)
        self.phases = tuple(phases)
        self.wall_tag = wall_tag
        self._owner = owner
        self._start: Optional[float] = None
        self._phases: Dict[str, float] = {}

    def bind_to_current_thread(self, track: Optional[str] = None) -> None:
        """The calling thread owns the timeline from now; ``track`` names its trace track."""
        if self._owner is threading.current_thread():
            return
        self._owner = threading.current_thread()
        if track:
            trace.name_thread(track)

    def on_owner_thread(self) -> bool:
        return self._owner is None or threading.current_thread() is self._owner

    def is_bound(self) -> bool:
        """Whether a thread owns this timeline yet."""
        return self._owner is not None

    @contextmanager
    def phase(self, tag: str) -> Iterator[None]:
        if not self.on_owner_thread():
            yield
            return
        tracer = trace.active()
        c0 = time.thread_time() if tracer is not None and tracer.thread_time else None
        cuda = tracer.cuda.start() if tracer is not None and tracer.cuda is not None else None
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self._phases[tag] = self._phases.get(tag, 0.0) + (t1 - t0)
            if tracer is not None and self._start is not None:  # inside a measured iteration
                tracer.complete(label(tag), t0, t1, "phase", args=_cpu_args(c0))
                if cuda is not None:
                    tracer.cuda.end(label(tag), cuda)

    def add(
        self,
        tag: str,
        seconds: float,
        spans: Optional[Iterable[Tuple[float, ...]]] = None,
    ) -> None:
        """Add a phase duration measured elsewhere (e.g. an idle gap between two calls). For a
        trace, ``spans`` are its (start, end) ``perf_counter`` intervals, optionally with the
        thread times (``time.thread_time``) at both ends; by default one interval ending now."""
        self._phases[tag] = self._phases.get(tag, 0.0) + seconds
        tracer = trace.active()
        if tracer is not None and self._start is not None:  # inside a measured iteration
            if spans is None:
                now = time.perf_counter()
                spans = [(now - seconds, now)]
            for span in spans:
                args = None
                if tracer.thread_time and len(span) == 4:
                    args = {"thread_cpu_ms": round((span[3] - span[2]) * 1e3, 3)}
                tracer.complete(label(tag), span[0], span[1], "phase", args=args)

    @contextmanager
    def background(self, tag: str) -> Iterator[None]:
        """Time work that overlaps the main loop (recorded, never part of the wall sum)."""
        tracer = trace.active()
        c0 = time.thread_time() if tracer is not None and tracer.thread_time else None
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self.tracker.scalar(**{tag: to_unit(tag, t1 - t0)})
            if tracer is not None:
                tracer.complete(label(tag), t0, t1, "background", args=_cpu_args(c0))

    def boundary(self) -> Optional[Dict[str, float]]:
        """Close the open iteration, record it, and open the next one.

        Every phase of the timeline is recorded for every iteration (0 when it did not run),
        so means are per iteration and phase shares of the wall time add up. Units follow
        the tag: ``_ms`` tags in milliseconds, the others (learning_time, iteration_time) in
        seconds.
        """
        now = time.perf_counter()
        closed = None
        if self._start is not None:
            closed = {tag: self._phases.get(tag, 0.0) for tag in self.phases}
            closed[self.wall_tag] = now - self._start
            self.tracker.scalar(**{tag: to_unit(tag, secs) for tag, secs in closed.items()})
            trace.complete(label(self.wall_tag), self._start, now, "iteration")
        self._start = now
        self._phases = {}
        return closed


def _cpu_args(c0: Optional[float]) -> Optional[Dict[str, float]]:
    """``thread_cpu_ms`` of a block that started at thread time c0 (``trace_thread_time``)."""
    if c0 is None:
        return None
    return {"thread_cpu_ms": round((time.thread_time() - c0) * 1e3, 3)}
