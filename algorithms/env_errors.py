"""Deterministic env errors stop the run; crashes are restarted.

RLlib restarts a failed EnvRunner up to ``max_num_env_runner_restarts`` times (raylab keeps
RLlib's 1000) whatever the cause. That is right for a crash that may not come back (the
process was killed, its node went away) and wrong for an env that raises on construction or on
step: it raises again in the new process, run after run. The two are told apart by what the
failure leaves:

- an exception raised by the env (in ``make_env`` or a sampling call) is reported by the
  EnvRunner itself, before RLlib ends the process, to the run's :class:`EnvErrorBoard` (a small
  Ray actor the driver creates, named after the run directory; entries per Tune trial);
- a killed process reports nothing; RLlib restarts it and counts the restart, as before.

Before each training step (``Algorithm.restore_env_runners``, RLlib's extension point for
bringing EnvRunners back) the algorithm reads the board when an EnvRunner is down or was just
restored: the ``MAX_SAME_ENV_ERRORS``-th report of one error (same type and message, from any
EnvRunner) stops the run with :class:`EnvError`, whose message is the env's own error in one
line. An env that cannot be built stops the run at once (RLlib's setup fails on it), and so does
an env error that leaves no EnvRunner running after ``RESTORE_WAIT_S``. Tune restores a failed
trial from its last checkpoint (``training.max_failures``, for crashes such as a killed Learner);
a trial restored after an env error stops again at once, since the board outlives the attempt.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Tuple

import ray

logger = logging.getLogger(__name__)

MAX_SAME_ENV_ERRORS = 3
BOARD_ATTR = "raylab_env_error_board"  # AlgorithmConfig attribute: the board's actor name
RESTORE_WAIT_S = 60.0  # longest wait for a restarted EnvRunner when none is up
_REPORT_TIMEOUT_S = 10.0
STOP_POLL_S = 0.5  # how often the algorithm asks the board whether the driver wants a stop


class EnvError(RuntimeError):
    """The env raised the same way in an EnvRunner too often in a row: the run stops."""


def board_name(key: str) -> str:
    """The board's Ray actor name for a run directory (or, without one, a trial id)."""
    import hashlib

    return "raylab-env-errors-" + hashlib.sha1(str(key).encode()).hexdigest()[:16]


def create_board(name: str):
    """The board, created by the driver before the Tuner starts (it lives as long as the
    driver, so a trial that Tune restores still sees what its previous attempt reported)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the creator's node (the driver's): anywhere else it dies with that node, and a worker
    # node lost mid-run took the board and then the trial down with it.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    board = EnvErrorBoard.options(name=name, get_if_exists=True, scheduling_strategy=here).remote()
    DRIVER_BOARDS.append(board)
    return board


DRIVER_BOARDS: List = []  # the boards this process created (the driver forwards stops to them)


def forward_stop() -> None:
    """Tell every board this driver created that a stop was requested (best effort)."""
    for board in DRIVER_BOARDS:
        try:
            board.request_stop.remote()
        except Exception:
            pass


@ray.remote(num_cpus=0, max_restarts=0)
class EnvErrorBoard:
    """How often each env error (``Type: message``) was reported, per trial and kind (``build``:
    the env's constructor, ``run``: reset / step), and by which EnvRunner last."""

    def __init__(self) -> None:
        self._errors: Dict[Tuple[str, str, str], List] = {}  # (trial, kind, msg) -> [n, index]
        self._stop = False  # the driver's stop request (Ctrl-C / SIGTERM), for the algorithm

    def request_stop(self) -> None:
        self._stop = True

    def stop_requested(self) -> bool:
        return self._stop

    def record(self, trial_id: str, worker_index: int, message: str, kind: str = "run") -> int:
        entry = self._errors.setdefault((str(trial_id), kind, message), [0, int(worker_index)])
        entry[0] += 1
        entry[1] = int(worker_index)
        return entry[0]

    def worst(self, trial_id: str, kind: Optional[str] = None) -> Optional[Tuple[str, int, int]]:
        """(message, reports, last EnvRunner index) of the trial's most reported error."""
        mine = {
            m: e
            for (t, k, m), e in self._errors.items()
            if t == str(trial_id) and kind in (None, k)
        }
        if not mine:
            return None
        message, (count, index) = max(mine.items(), key=lambda kv: kv[1][0])
        return message, count, index


def error_line(exc: BaseException) -> str:
    """The innermost cause of exc as ``Type: message`` on one line (RLlib re-raises an env's
    step error as a bare ``RuntimeError from e``)."""
    while exc.__cause__ is not None and not str(exc).strip():
        exc = exc.__cause__
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ------------------------------------------------------------------------- EnvRunner side


class EnvErrorReporting:
    """EnvRunner mixin: report env exceptions from ``make_env`` and sampling to the board."""

    def guarded(self, fn, *args, _kind: str = "run", **kwargs):
        """``fn(*args, **kwargs)``; an exception from it is reported, then raised on."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self._report_env_error(e, _kind)
            raise

    def _report_env_error(self, exc: BaseException, kind: str) -> None:
        trial_id = getattr(self, "tune_trial_id", None) or "default"
        name = getattr(self.config, BOARD_ATTR, None) or board_name(trial_id)
        try:
            board = ray.get_actor(name)
        except ValueError:  # no board: RLlib used without raylab's algorithm classes
            return
        try:  # synchronous: RLlib ends this process right after the exception
            ray.get(
                board.record.remote(
                    trial_id, getattr(self, "worker_index", 0), error_line(exc), kind
                ),
                timeout=_REPORT_TIMEOUT_S,
            )
        except Exception as e:  # the report is best effort; the exception itself goes on
            logger.warning("could not report an env error to the run: %s", e)

    def make_env(self):
        return self.guarded(super().make_env, _kind="build")

    def sample(self, *args, **kwargs):
        return self.guarded(super().sample, *args, **kwargs)


# ------------------------------------------------------------------------- Algorithm side


class EnvErrorPolicy:
    """Algorithm mixin: create the board, and stop on deterministic env errors."""

    def setup(self, config) -> None:
        # Before RLlib builds the EnvRunners (super().setup), so construction errors are seen.
        # The driver made the board (raylab train / tune); without one, the trial makes its own.
        name = getattr(config, BOARD_ATTR, None) or board_name(self.trial_id)
        self._env_error_board = create_board(name)
        # A trial Tune restored after a deterministic env error: stop before building anything.
        env_error = self._env_error(threshold=1, kind="build") or self._env_error(
            threshold=MAX_SAME_ENV_ERRORS
        )
        if env_error is not None:
            raise env_error
        try:
            super().setup(config)
        except Exception as e:
            env_error = self._env_error(threshold=1, kind="build")
            if env_error is not None:
                raise env_error from None
            raise e

    def stop_requested(self) -> bool:
        """Whether the driver asked the run to stop (polled at most every STOP_POLL_S)."""
        if getattr(self, "_stop_seen", False):
            return True
        now = time.monotonic()
        if now - getattr(self, "_stop_polled", 0.0) < STOP_POLL_S:
            return False
        self._stop_polled = now
        board = getattr(self, "_env_error_board", None)
        if board is None:
            return False
        try:
            self._stop_seen = bool(ray.get(board.stop_requested.remote(), timeout=2.0))
        except Exception:  # a lost board: no request reaches the algorithm this way
            return False
        return self._stop_seen

    def _env_error(self, threshold: int, kind: Optional[str] = None) -> Optional[EnvError]:
        board = getattr(self, "_env_error_board", None)
        if board is None:
            return None
        try:
            worst = ray.get(board.worst.remote(self.trial_id, kind))
        except ray.exceptions.RayActorError:  # the board is advice: its loss stops no trial
            return None
        if worst is None or worst[1] < threshold:
            return None
        message, count, index = worst
        if kind == "build":
            return EnvError(f"the env cannot be built in EnvRunner {index}: {message}")
        return EnvError(f"the env raised {count} times (last in EnvRunner {index}): {message}")

    def restore_env_runners(self, env_runner_group) -> List[int]:
        group = env_runner_group
        restored = list(super().restore_env_runners(group))
        if group is None or group.num_remote_env_runners() == 0:
            return restored
        healthy = group.num_healthy_remote_env_runners()
        if healthy == group.num_remote_env_runners() and not restored:
            return restored  # nothing failed: no look at the board
        deadline = time.monotonic() + RESTORE_WAIT_S
        while True:
            env_error = self._env_error(threshold=1, kind="build") or self._env_error(
                threshold=MAX_SAME_ENV_ERRORS
            )
            if env_error is not None:
                raise env_error
            if group.num_healthy_remote_env_runners() > 0:
                return restored
            # No EnvRunner is up (RLlib would sample on the local one, which has no env):
            # wait for Ray's restart, or stop when the env is why none comes back.
            if time.monotonic() > deadline:
                env_error = self._env_error(threshold=1)
                if env_error is not None:
                    raise env_error
                return restored
            time.sleep(1.0)
            restored += super().restore_env_runners(group)
