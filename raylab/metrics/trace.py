"""Perfetto / chrome://tracing timelines of raylab's phases (``training.trace_*``).

With ``training.trace_enabled=true`` every process that has a timeline writes one file of
Chrome trace events (the JSON array format): the algorithm loop (the process that drives the
iterations), each EnvRunner, each Learner. Every occurrence of a canonical phase becomes one
complete event (``"ph": "X"``) named by the schema's label (``Collector Wait``, ``Env Step``,
...), on the thread that ran it; nested diagnostics (the parts of an Env Step) and background
work (episode ingest, replay ingress) sit on their own tracks. Process and thread names are
metadata events, so Perfetto shows ``Learner 0 / learner thread`` rather than numbers.

One clock: timestamps are microseconds of wall time (``time.time``), taken as
``perf_counter`` plus an offset fixed when the process's tracer starts (:func:`wall_offset_us`),
so the files of NTP-synchronised machines line up. The offset of one process can still be off
by milliseconds (a wall-clock step, a process descheduled while it reads the two clocks), so
each file records its offset and its machine's boot id: ``raylab trace RUN_DIR``
(:mod:`raylab.metrics.trace_merge`) puts the files of one machine, whose ``perf_counter`` is the
same monotonic clock, on one common offset, merges everything into one ``merged.json`` and says
where the time went.

A process writes its events as it goes (every 2 s or 512 events) and closes the JSON array at
exit; a process killed before that leaves the array open, which the trace-event format allows
(readers here close it). ``MAX_EVENTS`` bounds one file (about 100 MB).

The tracer is process-global and off unless :func:`configure` turned it on; every hook costs one
attribute check when it is off.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from raylab.quiet import on_fast_exit

MAX_EVENTS = 1_000_000  # per process file
FLUSH_EVENTS = 512
FLUSH_S = 2.0
NESTED_TRACK = 1_000_000_000  # added to a thread id: that thread's nested-diagnostics track
FILE_SUFFIX = ".trace.json"

# Trace settings as they travel in the AlgorithmConfig (``raylab_trace`` attribute).
CONFIG_ATTR = "raylab_trace"


def wall_offset_us(samples: int = 7) -> float:
    """``time.time() - time.perf_counter()`` in microseconds: of several readings, the one whose
    ``time.time()`` call sat between the two closest ``perf_counter`` readings (a process
    descheduled between two reads would put its whole pause into the offset)."""
    best = None
    for _ in range(samples):
        a = time.perf_counter()
        wall = time.time()
        b = time.perf_counter()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) / 2)
    return best[1] * 1e6


def boot_id() -> Optional[str]:
    """This machine's boot id (Linux): processes with the same one share ``perf_counter``'s
    monotonic clock. None where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


class Tracer:
    """Trace events of one process, written to ``<out_dir>/<role>-<pid>.trace.json``."""

    def __init__(self, out_dir: str, role: str, process_name: str, thread_time: bool = False):
        self.pid = os.getpid()
        self.role = role
        self.thread_time = bool(thread_time)
        self.cuda: Optional[CudaEvents] = None  # set by configure() with trace_cuda_events
        self.path = Path(out_dir) / f"{role}-{self.pid}{FILE_SUFFIX}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._offset_us = wall_offset_us()
        self._lock = threading.Lock()
        self._pending: List[str] = []
        self._named_threads: Dict[int, str] = {}
        self._heads: Dict[Tuple[str, str], str] = {}  # (name, cat) -> the event's fixed head
        self._count = 0
        self._last_flush = time.monotonic()
        self._first = True
        self._closed = False
        # Unbuffered: each flush is one write of whole lines, so a process killed between two
        # flushes leaves a file that ends on a complete event (an open array).
        self._file = open(self.path, "wb", buffering=0)
        self._write("[\n")
        self._meta("process_name", {"name": process_name})
        self._meta(
            "raylab_clock",
            {
                "clock": "wall time (time.time), microseconds",
                "role": role,
                "pid": self.pid,
                "offset_us": self._offset_us,  # wall time minus perf_counter
                "boot_id": boot_id(),
            },
        )

    @property
    def events(self) -> int:
        """Complete events emitted so far (metadata not counted; past ``MAX_EVENTS`` they are
        counted, not written)."""
        return self._count

    # ---- events ----------------------------------------------------------------------------
    def us(self, perf_s: float) -> float:
        """A ``time.perf_counter()`` reading on the trace clock (microseconds of wall time)."""
        return perf_s * 1e6 + self._offset_us

    def complete(
        self,
        name: str,
        start: float,
        end: float,
        cat: str,
        track: Optional[int] = None,
        args: Optional[Dict[str, Any]] = None,
    ) -> None:
        """One complete event from ``start`` to ``end`` (``perf_counter`` seconds) on the
        calling thread (or on ``track``, a thread id of this process).

        The rollout loop calls this several times per vector step, so the event is formatted
        directly (its fixed head, ``name`` and ``cat`` JSON-escaped once and cached) rather
        than built as a dict and passed through ``json.dumps``: about a quarter of the CPU."""
        tid = threading.get_native_id() if track is None else track
        if tid not in self._named_threads:
            self._name_thread(tid)
        head = self._heads.get((name, cat))
        if head is None:
            head = f'{{"name":{json.dumps(name)},"cat":{json.dumps(cat)},"ph":"X","ts":'
            self._heads[(name, cat)] = head
        dur = (end - start) * 1e6
        line = (
            f'{head}{start * 1e6 + self._offset_us:.3f},"dur":{dur if dur > 0.0 else 0.0:.3f},'
            f'"pid":{self.pid},"tid":{tid}'
        )
        if args:
            line += f',"args":{json.dumps(args, separators=(",", ":"))}}}'
        else:
            line += "}"
        self._emit_line(line)

    def name_thread(self, name: str, tid: Optional[int] = None) -> None:
        """Give the calling thread (or ``tid``) a track name."""
        tid = threading.get_native_id() if tid is None else tid
        self._named_threads[tid] = name
        self._meta("thread_name", {"name": name}, tid=tid)
        if tid < NESTED_TRACK:  # its nested-diagnostics track is named after it
            self._named_threads[tid + NESTED_TRACK] = name + " · nested"
            self._meta("thread_name", {"name": name + " · nested"}, tid=tid + NESTED_TRACK)

    def _name_thread(self, tid: int) -> None:
        if tid >= NESTED_TRACK:
            base = tid - NESTED_TRACK
            if base not in self._named_threads:
                self._name_thread(base)
            return
        current = threading.current_thread()
        name = current.name if threading.get_native_id() == tid else f"thread {tid}"
        if name == "MainThread":
            name = "main thread"
        self.name_thread(name, tid)

    def _meta(self, what: str, args: Dict[str, Any], tid: Optional[int] = None) -> None:
        event = {"name": what, "ph": "M", "pid": self.pid, "args": args}
        if tid is not None:
            event["tid"] = tid
        self._emit(event, meta=True)

    def _emit(self, event: Dict[str, Any], meta: bool = False) -> None:
        self._emit_line(json.dumps(event, separators=(",", ":")), meta)

    def _emit_line(self, line: str, meta: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            if not meta:
                self._count += 1
                if self._count > MAX_EVENTS:
                    if self._count == MAX_EVENTS + 1:
                        marker = {
                            "name": f"trace truncated at {MAX_EVENTS} events",
                            "ph": "i",
                            "s": "p",
                            "ts": round(self.us(time.perf_counter()), 3),
                            "pid": self.pid,
                            "tid": threading.get_native_id(),
                        }
                        self._pending.append(json.dumps(marker, separators=(",", ":")))
                        self._flush_locked()
                    return
            self._pending.append(line)
            if len(self._pending) >= FLUSH_EVENTS or time.monotonic() - self._last_flush > FLUSH_S:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._pending:
            return
        sep = ",\n"
        text = sep.join(self._pending)
        self._write(text if self._first else sep + text)
        self._first = False
        self._pending.clear()
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            self._write("\n]\n")
            self._file.close()
            self._closed = True

    def _write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:  # a regular file takes it in one write; the loop covers a short write
            data = data[self._file.write(data) :]


class CudaEvents:
    """Device work timed with CUDA events (``training.trace_cuda_events``, GPU learners only).

    Around each traced phase of a timeline a pair of timing events is recorded on the current
    stream; once the device has passed the second (polled without blocking), the interval the
    device spent between them becomes a complete event on this process's ``CUDA`` track,
    placed on the trace clock through a reference event synchronised when tracing started.
    """

    TRACK = 2_000_000_000  # the CUDA track's thread id

    def __init__(self, tracer: "Tracer", cuda: Any):
        self.tracer, self.cuda = tracer, cuda
        self.ref = cuda.Event(enable_timing=True)
        self.ref.record()
        self.ref.synchronize()
        self.ref_perf = time.perf_counter()
        self.pending: List[Any] = []
        tracer.name_thread("CUDA (device time of each phase)", tid=self.TRACK)

    def start(self) -> Any:
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self, name: str, start: Any) -> None:
        end = self.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((name, start, end))
        self.poll()

    def poll(self) -> None:
        """Emit the pairs the device has completed (in order; never waits)."""
        while self.pending and self.pending[0][2].query():
            name, start, end = self.pending.pop(0)
            t0 = self.ref_perf + self.ref.elapsed_time(start) / 1e3  # elapsed_time: ms
            t1 = t0 + start.elapsed_time(end) / 1e3
            self.tracer.complete(name, t0, t1, "cuda", track=self.TRACK)


# ---------------------------------------------------------------------- the process's tracer

_TRACER: Optional[Tracer] = None


def configure(settings: Optional[Dict[str, Any]], role: str, process_name: str) -> None:
    """Start this process's tracer from the run's trace settings (``{"dir", "thread_time"}``;
    None or no ``dir``: tracing stays off). Idempotent per process."""
    global _TRACER
    if not settings or not settings.get("dir") or _TRACER is not None:
        return
    _TRACER = Tracer(
        settings["dir"], role, process_name, thread_time=bool(settings.get("thread_time"))
    )
    if settings.get("cuda_events"):
        import torch

        if torch.cuda.is_available():  # the GPU learners; EnvRunners have no device work
            _TRACER.cuda = CudaEvents(_TRACER, torch.cuda)
    atexit.register(shutdown)
    on_fast_exit(shutdown)  # raylab.quiet's SIGTERM exit skips atexit


def shutdown() -> None:
    """Close this process's trace file (the JSON array); called at exit and on SIGTERM."""
    global _TRACER
    tracer, _TRACER = _TRACER, None
    if tracer is not None:
        tracer.close()


def active() -> Optional[Tracer]:
    return _TRACER


def complete(name: str, start: float, end: float, cat: str, **kw) -> None:
    if _TRACER is not None:
        _TRACER.complete(name, start, end, cat, **kw)


@contextmanager
def span(name: str, cat: str) -> Iterator[None]:
    """Trace the block as one complete event (nothing when tracing is off)."""
    tracer = _TRACER
    if tracer is None:
        yield
        return
    t0 = time.perf_counter()
    c0 = time.thread_time() if tracer.thread_time else None
    try:
        yield
    finally:
        t1 = time.perf_counter()
        args = (
            {"thread_cpu_ms": round((time.thread_time() - c0) * 1e3, 3)} if c0 is not None else None
        )
        tracer.complete(name, t0, t1, cat, args=args)


def name_thread(name: str) -> None:
    if _TRACER is not None:
        _TRACER.name_thread(name)


def nested_track() -> int:
    """The calling thread's nested-diagnostics track id."""
    return threading.get_native_id() + NESTED_TRACK


def settings_from(config: Any) -> Optional[Dict[str, Any]]:
    """The trace settings an AlgorithmConfig carries (None: tracing off)."""
    return getattr(config, CONFIG_ATTR, None)
