"""Keep raylab's output raylab's own: library chatter that is not the user's to act on is
silenced or routed, and a real problem still reaches the user as one line.

- Python loggers: RLlib and Ray Tune log deprecation notices and "new API stack" banners at
  WARNING level in every worker; :func:`quiet_logs` raises them to ERROR. raylab installs it in
  the driver and, through Ray's ``worker_process_setup_hook``, in every worker process it
  starts; EnvRunners call it again when they build their env (a Ray job may bring its own hook).
- MuJoCo's C warnings (:func:`route_mujoco_warnings`): known deprecation notices of model files
  that are not raylab's (Gymnasium's HalfCheetah declares ``settotalmass``) are dropped; every
  other warning (an unstable simulation, say) is printed as one ``raylab: MuJoCo warning:``
  line instead of MuJoCo's ``WARNING:`` line and blank line.
- Tracebacks at exit (:func:`quiet_worker`): Ray's SIGTERM handler raises ``SystemExit``
  wherever the worker's main thread is. A worker is sent SIGTERM when it is being ended
  (``ray.kill`` of an EnvRunner, Ray shutting down), often while it is already finalizing
  objects, and the ``SystemExit`` landing in RLlib's ``EnvRunner.__del__`` or
  ``LearnerGroup.__del__`` printed "Exception ignored" tracebacks after a run had completed
  or stopped. In raylab's worker processes SIGTERM ends the process at once, after flushing
  its output, as SIGKILL would without the traceback. The driver keeps its own handler (a
  graceful stop, ``raylab.reporting.StopRequest``).
- Whole lines at the driver (:class:`WholeLines`, installed by the ``raylab`` console script):
  Ray's log thread prints its workers' lines to the driver's stderr while raylab prints its
  own, and ``print`` writes a line's text and its newline in two calls, so two threads could
  splice their lines into one (raylab's failure line with a worker's log glued to its end).
- One line of Ray's own, at the driver (:data:`RAY_SKIP_LINES`, through Ray's documented
  ``RAY_DEDUP_LOGS_SKIP_REGEX``, set in ``raylab/__init__.py`` before Ray is imported).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings

NOISY_LOGGERS = ("ray.rllib", "ray._common.deprecation", "ray.tune", "ray.train")

# Ray's core worker logs this ERROR whenever an actor with max_restarts > 0 gets a constructor
# argument from the object store. RLlib creates every EnvRunner that way: its config as an
# ObjectRef that the Algorithm actor owns and holds for its whole life (ray-project/ray#53727
# is about that object being lost, which takes the Algorithm's own process or node down, and
# Tune then restores the trial from its checkpoint). Nothing the user can act on: skipped.
RAY_SKIP_LINES = r"has constructor arguments in the object store and max_restarts > 0"

# MuJoCo deprecation notices of model files raylab does not ship.
KNOWN_MUJOCO_NOTICES = ("compiler attribute 'settotalmass' is deprecated",)

_mujoco_routed = False


def skip_ray_lines() -> None:
    """Add :data:`RAY_SKIP_LINES` to ``RAY_DEDUP_LOGS_SKIP_REGEX`` (kept with the user's own);
    effective when called before Ray is imported."""
    user = os.environ.get("RAY_DEDUP_LOGS_SKIP_REGEX")
    if RAY_SKIP_LINES not in (user or ""):
        joined = f"{user}|{RAY_SKIP_LINES}" if user else RAY_SKIP_LINES
        os.environ["RAY_DEDUP_LOGS_SKIP_REGEX"] = joined


def quiet_logs() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    route_mujoco_warnings()


_FAST_EXIT_HOOKS: list = []


def on_fast_exit(hook) -> None:
    """Run ``hook()`` before a SIGTERM ends this process at once (files that must be closed:
    a trace's JSON array); atexit handlers do not run there."""
    if hook not in _FAST_EXIT_HOOKS:
        _FAST_EXIT_HOOKS.append(hook)


def _exit_at_once(signum, frame) -> None:
    for hook in _FAST_EXIT_HOOKS:
        try:
            hook()
        except Exception:
            pass
    flush_std_streams()
    os._exit(128 + signum)


def flush_std_streams() -> None:
    """Flush stdout and stderr, ignoring a closed or broken stream (before ``os._exit``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush_all() if isinstance(stream, WholeLines) else stream.flush()
        except Exception:
            pass


class WholeLines:
    """A text stream that passes each thread's output on a whole line at a time: what a
    thread writes is held until its newline (or its ``flush``), then written in one call under
    a lock, so lines printed by two threads never splice. Everything else (``isatty``,
    ``fileno``, ``encoding``) is the wrapped stream's."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._lock = threading.RLock()  # a signal handler may print in the middle of a write
        self._pending: dict = {}  # thread id -> its text after its last newline

    def write(self, text: str) -> int:
        tid = threading.get_ident()
        with self._lock:
            held = self._pending.pop(tid, "") + text
            cut = held.rfind("\n") + 1
            if cut:
                self.stream.write(held[:cut])
            if cut < len(held):
                self._pending[tid] = held[cut:]
        return len(text)

    def flush(self) -> None:
        """Write this thread's unfinished line (a prompt, a progress bar), then flush."""
        with self._lock:
            held = self._pending.pop(threading.get_ident(), "")
            if held:
                self.stream.write(held)
        self.stream.flush()

    def flush_all(self) -> None:
        """Write every thread's unfinished line, then flush (at exit)."""
        with self._lock:
            for held in self._pending.values():
                self.stream.write(held)
            self._pending.clear()
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def whole_lines() -> None:
    """Wrap this process's stdout and stderr in :class:`WholeLines` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, WholeLines):
            setattr(sys, name, WholeLines(stream))


def quiet_worker() -> None:
    """:func:`quiet_logs`, and SIGTERM ends this worker process at once (see the module
    docstring). Ray's ``worker_process_setup_hook`` in the runs raylab starts; raylab's
    EnvRunners and algorithms call it too (a Ray job's workers have no raylab hook). Only the
    main thread can set a signal handler; elsewhere only the logs are quieted."""
    quiet_logs()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_at_once)


def quiet_actor() -> None:
    """For code that runs in a Ray actor or in the caller's own process (an EnvRunner, an
    algorithm built in-process by ``raylab bench``): :func:`quiet_worker` inside a Ray actor,
    :func:`quiet_logs` elsewhere (a driver keeps its own SIGTERM handler)."""
    import ray

    in_actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    quiet_worker() if in_actor else quiet_logs()


def mujoco_warning(message: str) -> None:
    """MuJoCo's warning callback in raylab's processes (see the module docstring)."""
    text = " ".join(message.split())
    if not any(notice in text for notice in KNOWN_MUJOCO_NOTICES):
        print(f"raylab: MuJoCo warning: {text}", file=sys.stderr, flush=True)


def route_mujoco_warnings() -> None:
    """Install :func:`mujoco_warning` as MuJoCo's warning callback (once per process)."""
    global _mujoco_routed
    if _mujoco_routed:
        return
    try:
        import mujoco
    except ImportError:  # pragma: no cover - mujoco is a dependency
        return
    mujoco.set_mju_user_warning(mujoco_warning)
    _mujoco_routed = True
