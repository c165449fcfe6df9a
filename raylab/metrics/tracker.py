"""Stats tracker: record statistics anywhere, reduce them across workers at export time.

Named trackers keep separate namespaces (``get("rollout")`` exports keys under ``rollout/``;
the default tracker ``get()`` has no prefix). Scopes nest key prefixes per thread::

    from raylab.metrics import tracker

    tracker.scalar(lr=3e-4)                              # "lr" (+ "lr__count")
    with tracker.scope("sac"):
        tracker.denominator(valid=mask)                  # boolean mask, "sac/valid" = count of True
        tracker.stat(q=q_values, denominator="valid")    # "sac/q/avg", "sac/q/min", "sac/q/max"
    with tracker.record_timing("sample"):                # "timeperf/sample" (seconds)
        ...
    with tracker.record_timing(schema.PERF_LEARNER_REPLAY_SAMPLE_MS, under=None):  # canonical, ms
        ...

Reduce types: ``AVG_MIN_MAX`` (default for ``stat``), ``AVG``, ``SUM``, ``MIN``, ``MAX``, and
``SCALAR`` (what ``scalar`` records: the mean with its ``__count``).

Export and reduction. ``export(reset=True)`` returns *partial states*: per key the exact sum
(as a short string), the element count, min, max and any NaN / inf contribution; they are plain
picklable / JSON-able dicts. Each Ray actor exports its own;
:func:`merge_exports` combines any number of them into final numbers. Sums are kept exactly
(as integers in units of the smallest float64), so the final numbers are identical, bit for
bit, to one tracker fed all the data, whatever the split across workers or their order. A key
with no elements (an empty denominator, a key some worker never saw) is omitted, never 0/0
or NaN.

All recording methods are thread safe; scopes are per thread.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from enum import Enum
from fractions import Fraction
from typing import Dict, Iterable, Iterator, List, Mapping, Optional

import numpy as np

__all__ = [
    "ReduceType",
    "StatsTracker",
    "get",
    "scope",
    "scalar",
    "denominator",
    "stat",
    "record_timing",
    "export",
    "export_all",
    "merge_exports",
    "drop_counts",
]


class ReduceType(str, Enum):
    AVG_MIN_MAX = "avg_min_max"
    AVG = "avg"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    SCALAR = "scalar"


# frexp writes a finite float64 as m * 2**e; m * 2**53 is an integer and e - 53 >= -1126, so
# every finite float64 is an integer multiple of 2**_EXP_BASE.
_EXP_BASE = -1126
_SCALE = Fraction(1, 2**-_EXP_BASE)
_COUNT_SUFFIX = "__count"


def _to_numpy(x, dtype) -> np.ndarray:
    """A NumPy copy of a tensor / array / sequence / number, in ``dtype``."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().to("cpu")
        x = x.bool() if dtype == np.bool_ else x.double()
        return x.numpy().astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)


def _is_bool(x) -> bool:
    if type(x).__module__.startswith("torch"):
        return str(x.dtype) == "torch.bool"
    return np.asarray(x).dtype == np.bool_


def _exact_sum(values: np.ndarray) -> int:
    """The exact sum of finite float64 values, as an integer count of 2**_EXP_BASE."""
    values = values[values != 0.0]
    if values.size == 0:
        return 0
    mant, exp = np.frexp(values)  # values = mant * 2**exp, 0.5 <= |mant| < 1
    ints = (mant * 2.0**53).astype(np.int64)  # exact: 53-bit signed integers
    hi = ints >> 26  # split so group sums of up to 2**36 elements fit in int64
    lo = ints - (hi << 26)
    order = np.argsort(exp, kind="stable")
    exp_sorted = exp[order]
    starts = np.flatnonzero(np.r_[True, exp_sorted[1:] != exp_sorted[:-1]])
    hi_sums = np.add.reduceat(hi[order], starts).tolist()
    lo_sums = np.add.reduceat(lo[order], starts).tolist()
    total = 0
    for e, hi_sum, lo_sum in zip(exp_sorted[starts].tolist(), hi_sums, lo_sums):
        shift = e - 53 - _EXP_BASE
        total += (hi_sum << (shift + 26)) + (lo_sum << shift)
    return total


def _nan_min(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return min(a, b)


def _nan_max(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def _empty_state(reduce_type: ReduceType) -> dict:
    return {
        "type": reduce_type.value,
        "sum": 0,  # exact finite sum in units of 2**_EXP_BASE
        "nonfinite": 0.0,  # sum of the NaN / inf elements (0.0 when there were none)
        "count": 0,
        "min": math.inf,
        "max": -math.inf,
    }


def _add_values(state: dict, values: np.ndarray) -> None:
    if values.size == 0:
        return
    finite = np.isfinite(values)
    if not finite.all():
        state["nonfinite"] = float(state["nonfinite"] + values[~finite].sum())
        values_finite = values[finite]
    else:
        values_finite = values
    state["sum"] += _exact_sum(values_finite)
    state["count"] += int(values.size)
    state["min"] = _nan_min(state["min"], float(np.min(values)))
    state["max"] = _nan_max(state["max"], float(np.max(values)))


def _encode_sum(n: int) -> str:
    """``"<hex>p<shift>"`` with n == int(hex, 16) << shift: short, exact, not a number."""
    if n == 0:
        return "0x0p0"
    shift = (n & -n).bit_length() - 1  # trailing zero bits
    return f"{hex(n >> shift)}p{shift}"


def _decode_sum(text: str) -> int:
    mantissa, _, shift = text.partition("p")
    return int(mantissa, 16) << int(shift)


def _exported(state: dict) -> dict:
    """The exported form of a state: the exact sum as a string.

    A string keeps loggers that flatten results (Tune, RLlib) from treating the huge integer as
    a number (``float()`` of it overflows).
    """
    out = dict(state)
    out["sum"] = _encode_sum(state["sum"])
    return out


def _internal(state: Mapping) -> dict:
    out = dict(state)
    total = state["sum"]
    out["sum"] = _decode_sum(total) if isinstance(total, str) else int(total)
    return out


def _merge_state(into: dict, other: dict, key: str) -> None:
    if into["type"] != other["type"]:
        raise ValueError(
            f"stat '{key}' was recorded as {into['type']} and as {other['type']}; "
            "use one reduce type"
        )
    into["sum"] += other["sum"]
    into["nonfinite"] = float(into["nonfinite"] + other["nonfinite"])
    into["count"] += other["count"]
    into["min"] = _nan_min(into["min"], other["min"])
    into["max"] = _nan_max(into["max"], other["max"])


def _total(state: dict) -> Fraction | float:
    if state["nonfinite"] != 0.0:  # NaN or +-inf dominates any finite sum
        return state["nonfinite"]
    return Fraction(state["sum"]) * _SCALE


def _finalize(key: str, state: dict, out: Dict[str, float]) -> None:
    count = state["count"]
    if count == 0:
        return
    kind = ReduceType(state["type"])
    total = _total(state)
    mean = float(total / count) if isinstance(total, Fraction) else total
    if kind is ReduceType.SCALAR:
        out[key] = mean
        out[key + _COUNT_SUFFIX] = float(count)
    elif kind is ReduceType.AVG:
        out[key] = mean
    elif kind is ReduceType.SUM:
        out[key] = float(total)
    elif kind is ReduceType.MIN:
        out[key] = state["min"]
    elif kind is ReduceType.MAX:
        out[key] = state["max"]
    else:
        out[key + "/avg"] = mean
        out[key + "/min"] = state["min"]
        out[key + "/max"] = state["max"]


class StatsTracker:
    """One namespace of statistics. Use :func:`get` rather than constructing one directly."""

    def __init__(self, name: str = ""):
        self.name = name
        self._lock = threading.RLock()
        self._local = threading.local()
        self._states: Dict[str, dict] = {}
        self._masks: Dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ keys and scopes
    def _scopes(self) -> List[str]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _key(self, name: str) -> str:
        if not name:
            raise ValueError("a stat key must not be empty")
        parts = ([self.name] if self.name else []) + self._scopes() + [name]
        return "/".join(parts)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix every key recorded inside the block (in this thread) with ``name/``."""
        if not isinstance(name, str) or not name.strip("/"):
            raise ValueError(f"bad scope name {name!r}")
        stack = self._scopes()
        stack.append(name.strip("/"))
        try:
            yield
        finally:
            stack.pop()

    # ------------------------------------------------------------------ recording
    def _record(self, key: str, reduce_type: ReduceType, values: np.ndarray) -> None:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _empty_state(reduce_type)
        elif state["type"] != reduce_type.value:
            raise ValueError(
                f"stat '{key}' was recorded as {state['type']}, now as {reduce_type.value}"
            )
        _add_values(state, values)

    def scalar(self, **values) -> None:
        """Record single numbers; each key exports its mean and ``key__count``."""
        with self._lock:
            for name, value in values.items():
                arr = _to_numpy(value, np.float64)
                if arr.size != 1:
                    raise ValueError(f"scalar '{name}' has {arr.size} elements; use stat()")
                self._record(self._key(name), ReduceType.SCALAR, arr.reshape(1))

    def scalar_series(self, **values) -> None:
        """Record a series of single numbers per key at once: the same statistics as one
        :meth:`scalar` call per element (a loop that times every step records its timings
        once per fragment this way)."""
        with self._lock:
            for name, value in values.items():
                arr = _to_numpy(value, np.float64).reshape(-1)
                if arr.size:
                    self._record(self._key(name), ReduceType.SCALAR, arr)

    def denominator(self, **masks) -> None:
        """Register boolean masks that later :meth:`stat` calls refer to by name.

        Each mask also exports the number of selected elements under its own key (a SUM).
        """
        with self._lock:
            for name, mask in masks.items():
                if not _is_bool(mask):
                    raise ValueError(f"denominator '{name}' must be a boolean mask")
                arr = _to_numpy(mask, np.bool_)
                key = self._key(name)
                self._masks[key] = arr
                self._record(key, ReduceType.SUM, arr.astype(np.float64).reshape(-1))

    def stat(
        self,
        denominator: str,
        reduce_type: ReduceType | str = ReduceType.AVG_MIN_MAX,
        **values,
    ) -> None:
        """Record the elements of each array selected by the named denominator mask."""
        reduce_type = ReduceType(reduce_type)
        if reduce_type is ReduceType.SCALAR:
            raise ValueError(
                "SCALAR is what scalar() records; pick AVG_MIN_MAX, AVG, SUM, MIN or MAX"
            )
        with self._lock:
            dkey = self._key(denominator)
            mask = self._masks.get(dkey)
            if mask is None:
                known = ", ".join(sorted(self._masks)) or "none"
                raise KeyError(f"unknown denominator '{dkey}'; registered: {known}")
            for name, value in values.items():
                arr = _to_numpy(value, np.float64)
                if arr.shape != mask.shape:
                    raise ValueError(
                        f"stat '{name}' has shape {arr.shape}, its denominator "
                        f"'{dkey}' {mask.shape}"
                    )
                self._record(self._key(name), reduce_type, arr[mask].reshape(-1))

    @contextlib.contextmanager
    def record_timing(self, name: str, under: Optional[str] = "timeperf") -> Iterator[None]:
        """Time the block and record it as a scalar.

        The key is ``<tracker>/<scopes>/<under>/<name>``; ``under=None`` drops the ``timeperf``
        level, which is how canonical tags (``Perf/..._ms``) are recorded. A name ending in
        ``_ms`` records milliseconds, any other name seconds (the schema's unit rule).
        """
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            if name.endswith("_ms"):
                elapsed *= 1000.0
            if under:
                with self.scope(under):
                    self.scalar(**{name: elapsed})
            else:
                self.scalar(**{name: elapsed})

    # ------------------------------------------------------------------ export
    def export(self, reset: bool = True) -> Dict[str, dict]:
        """Partial states of every key (combine with :func:`merge_exports`)."""
        with self._lock:
            out = {k: _exported(v) for k, v in self._states.items()}
            if reset:
                self.reset()
        return out

    def reset(self) -> None:
        with self._lock:
            self._states.clear()
            self._masks.clear()


# ---------------------------------------------------------------------- module level API

_TRACKERS: Dict[str, StatsTracker] = {}
_TRACKERS_LOCK = threading.Lock()


def get(name: str = "") -> StatsTracker:
    """The tracker called ``name`` in this process (created on first use); ``""`` is the default."""
    with _TRACKERS_LOCK:
        tracker = _TRACKERS.get(name)
        if tracker is None:
            tracker = _TRACKERS[name] = StatsTracker(name)
        return tracker


def scope(name: str):
    return get().scope(name)


def scalar(**values) -> None:
    get().scalar(**values)


def denominator(**masks) -> None:
    get().denominator(**masks)


def stat(
    denominator: str, reduce_type: ReduceType | str = ReduceType.AVG_MIN_MAX, **values
) -> None:
    get().stat(denominator, reduce_type, **values)


def record_timing(name: str, under: Optional[str] = "timeperf"):
    return get().record_timing(name, under)


def export(reset: bool = True) -> Dict[str, dict]:
    """Partial states of the default tracker."""
    return get().export(reset)


def export_all(reset: bool = True) -> Dict[str, dict]:
    """Partial states of every tracker in this process, combined into one export."""
    with _TRACKERS_LOCK:
        trackers = list(_TRACKERS.values())
    return merge_partials([t.export(reset) for t in trackers])


def merge_partials(exports: Iterable[Mapping[str, dict]]) -> Dict[str, dict]:
    """Combine partial states into one partial state (still mergeable)."""
    merged: Dict[str, dict] = {}
    for export_ in exports:
        for key, state in export_.items():
            if key in merged:
                _merge_state(merged[key], _internal(state), key)
            else:
                merged[key] = _internal(state)
    return {k: _exported(v) for k, v in merged.items()}


def merge_exports(exports: Iterable[Mapping[str, dict]]) -> Dict[str, float]:
    """Final numbers from the partial states of any number of trackers / workers.

    Identical to one tracker fed all the data. Keys without elements are omitted.
    """
    out: Dict[str, float] = {}
    for key, state in sorted(merge_partials(exports).items()):
        _finalize(key, _internal(state), out)
    return out


def drop_counts(stats: Mapping[str, float]) -> Dict[str, float]:
    """Final numbers without the ``__count`` weights (what a metric backend receives)."""
    return {k: v for k, v in stats.items() if not k.endswith(_COUNT_SUFFIX)}
