"""Term tables for batched tasks: observations, rewards, terminations, commands and events.

A task is a handful of small declarative tables. Each term is a plain function of the batched
env that returns one value (or one row) per env, computed for all N envs at once with NumPy:

    OBSERVATIONS = (ObsTerm("joint_vel", obs_joint_vel, 14, scale=0.05), ...)
    REWARD_TERMS = {"upright": upright, "action_rate": action_rate}  # weights: rew_<name>
    TERMINATIONS = (TerminationTerm("time_out", time_out, time_out=True),)

Adding a reward term is one function, one entry in ``REWARD_TERMS`` and its weight, the option
``rew_<name>`` of the task's options dataclass (:func:`reward_table`). The managers below turn
the tables into arrays, keep the per-term logging sums, and hand them out with ``pop_log()``:

- ``reward/<term>``: mean over envs and over the env-steps since the last pop of raw value x
  weight (envs that were being reset on a step are not counted on that step);
- ``Episode_Termination/<term>``: number of episodes ended by that term since the last pop.

These are two tag families of the canonical metric schema. The envs are the bottom layer and
import nothing above ``raylab.envs``, so :func:`reward_tag` / :func:`termination_tag` below spell
the two prefixes; a test holds them equal to ``raylab.metrics.schema``'s helpers.

Arithmetic note: the batched env must equal the single-env reference bit for bit. Term
functions therefore stay elementwise per env, and any reduction over a term's channels runs
along the last (contiguous) axis of a C-contiguous (N, k) array, which numpy sums with the same
pairwise tree as the reference's 1-D (k,) reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

TermFn = Callable[[Any], np.ndarray]


def reward_tag(term: str) -> str:
    """``reward/<term>``: the log key (and metric tag) of a reward term."""
    return "reward/" + term


def termination_tag(term: str) -> str:
    """``Episode_Termination/<term>``: the log key (and metric tag) of a termination term."""
    return "Episode_Termination/" + term


# ---------------------------------------------------------------------------------------------
# Observations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObsTerm:
    """``fn(env) -> (N, size)`` float64; the observation is ``raw * scale`` with a float32 scale."""

    name: str
    fn: TermFn
    size: int
    scale: float = 1.0


class ObservationManager:
    """Concatenates the terms in table order, scales them and casts to float32.

    The scale table is float32 (as the reference's constants are); multiplying the float64 raw
    values by it promotes each constant to float64 exactly as numpy does for the reference.

    With ``history=k`` the observation also holds the policy's previous k observations (the
    first ``policy_dim`` entries of the previous k returned observations, newest first) right
    after the policy's entries and before the critic-only ones: [policy, history, privileged].
    An env whose episode starts with this observation (``fresh``) has its history filled with
    its first observation.
    """

    def __init__(
        self,
        terms: Sequence[ObsTerm],
        num_envs: int,
        policy_dim: Optional[int] = None,
        history: int = 0,
    ):
        _check_unique(terms, "observation")
        self.terms = tuple(terms)
        self.term_dim = sum(t.size for t in self.terms)
        self.policy_dim = self.term_dim if policy_dim is None else int(policy_dim)
        self.history = int(history)
        self.dim = self.term_dim + self.history * self.policy_dim
        self.scale = np.concatenate(
            [np.full(t.size, t.scale, dtype=np.float32) for t in self.terms]
        )
        # Where each term (and the history) lies in the returned observation.
        self._term_slices = []  # (term, its slice of the term vector)
        start = 0
        for t in self.terms:
            self._term_slices.append((t, slice(start, start + t.size)))
            start += t.size
        self.slices: Dict[str, slice] = {}
        start = 0
        for t in self.terms:
            if start == self.policy_dim and self.history:
                self.slices["history"] = slice(start, start + self.history * self.policy_dim)
                start += self.history * self.policy_dim
            self.slices[t.name] = slice(start, start + t.size)
            start += t.size
        if self.history and "history" not in self.slices:
            self.slices["history"] = slice(start, start + self.history * self.policy_dim)
        self._raw = np.zeros((num_envs, self.term_dim))
        self._hist = np.zeros((num_envs, self.history, self.policy_dim))
        self.obs = np.zeros((num_envs, self.dim), dtype=np.float32)

    def compute(self, env, fresh=None, rows=None) -> np.ndarray:
        """Fill and return the preallocated (N, dim) float32 buffer (callers copy it out).

        ``rows``: the envs whose observation is returned now (default all): only their history
        moves on. ``fresh``: those whose episode starts with it."""
        for t, where in self._term_slices:
            self._raw[:, where] = t.fn(env)
        np.multiply(self._raw, self.scale, out=self._raw)
        if not self.history:
            self.obs[:] = self._raw
            return self.obs
        p, h = self.policy_dim, self._hist
        frame = self._raw[:, :p]
        if fresh is not None and len(fresh):
            h[fresh] = frame[fresh][:, None, :]
        hist = self.slices["history"]
        self.obs[:, :p] = frame
        self.obs[:, hist] = h.reshape(len(h), -1)
        self.obs[:, hist.stop :] = self._raw[:, p:]
        ids = slice(None) if rows is None else rows
        h[ids, 1:] = h[ids, :-1]
        h[ids, 0] = frame[ids]
        return self.obs


# ---------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardTerm:
    """``fn(env) -> (N,)`` raw value; the env's reward adds ``weight * raw`` in table order."""

    name: str
    fn: TermFn
    weight: float


REWARD_PREFIX = "rew_"


def reward_table(
    terms: Mapping[str, TermFn], opts: Any, defaults: Optional[Mapping[str, float]] = None
) -> Tuple[RewardTerm, ...]:
    """A task's reward table from its options: every term of ``terms`` (in its order) whose
    weight, the option ``rew_<name>``, is not zero. A ``None`` weight takes ``defaults[name]``
    (0 when absent): a task with presets of weights (the balance task's reward versions) keeps
    ``rew_<name>`` at ``None`` unless the user sets it."""
    defaults = defaults or {}
    table = []
    for name, fn in terms.items():
        weight = getattr(opts, REWARD_PREFIX + name)
        weight = float(defaults.get(name, 0.0) if weight is None else weight)
        if weight != 0.0:
            table.append(RewardTerm(name, fn, weight))
    return tuple(table)


def reward_weight_fields(config_cls: type) -> List[str]:
    """The ``rew_<term>`` fields of a task's options dataclass."""
    return [f.name for f in fields(config_cls) if f.name.startswith(REWARD_PREFIX)]


class RewardManager:
    def __init__(self, terms: Sequence[RewardTerm], num_envs: int):
        _check_unique(terms, "reward")
        self.terms = tuple(terms)
        self.names = tuple(t.name for t in self.terms)
        self.weighted = np.zeros((len(self.terms), num_envs))  # weight * raw, per term and env
        self.total = np.zeros(num_envs)
        self._sums = np.zeros(len(self.terms))
        self._count = 0

    def compute(self, env, active: np.ndarray) -> np.ndarray:
        """Per-env reward; rows where ``active`` is False (envs being reset) are zero."""
        self.total[:] = 0.0
        for k, t in enumerate(self.terms):
            self.weighted[k] = t.weight * t.fn(env)
            self.total += self.weighted[k]
        inactive = ~active
        if inactive.any():
            self.weighted[:, inactive] = 0.0
            self.total[inactive] = 0.0
        self._sums += self.weighted.sum(axis=1)
        self._count += int(active.sum())
        return self.total

    def weighted_term(self, name: str) -> np.ndarray:
        """This step's weight x raw of one term, per env; zeros when the table leaves it out."""
        if name not in self.names:
            return np.zeros_like(self.total)
        return self.weighted[self.names.index(name)]

    def step_log(self, active: np.ndarray) -> Dict[str, float]:
        """This step's ``reward/<term>``: mean over the active envs of raw x weight."""
        n = int(active.sum())
        if n == 0:
            return {}
        means = self.weighted[:, active].sum(axis=1) / n
        return {reward_tag(name): float(v) for name, v in zip(self.names, means)}

    def pop_log(self) -> Dict[str, float]:
        """Means since the last pop; empty when no env-step was taken since then."""
        out = {}
        if self._count > 0:
            out = {
                reward_tag(name): float(s / self._count) for name, s in zip(self.names, self._sums)
            }
        self._sums[:] = 0.0
        self._count = 0
        return out


# ---------------------------------------------------------------------------------------------
# Terminations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TerminationTerm:
    """``fn(env) -> (N,) bool``. ``time_out`` terms truncate (the learner bootstraps); the others
    terminate."""

    name: str
    fn: TermFn
    time_out: bool = False


class TerminationManager:
    def __init__(self, terms: Sequence[TerminationTerm], num_envs: int):
        _check_unique(terms, "termination")
        self.terms = tuple(terms)
        self.names = tuple(t.name for t in self.terms)
        self.flags = np.zeros((len(self.terms), num_envs), dtype=bool)
        self.terminated = np.zeros(num_envs, dtype=bool)
        self.truncated = np.zeros(num_envs, dtype=bool)
        self._counts = np.zeros(len(self.terms), dtype=np.int64)
        self._step_counts = np.zeros(len(self.terms), dtype=np.int64)

    def compute(self, env, active: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        self.terminated[:] = False
        self.truncated[:] = False
        for k, t in enumerate(self.terms):
            self.flags[k] = np.asarray(t.fn(env), dtype=bool) & active
            if t.time_out:
                self.truncated |= self.flags[k]
            else:
                self.terminated |= self.flags[k]
        self._step_counts = self.flags.sum(axis=1)
        self._counts += self._step_counts
        return self.terminated, self.truncated

    def step_log(self) -> Dict[str, int]:
        return {termination_tag(n): int(c) for n, c in zip(self.names, self._step_counts)}

    def pop_log(self) -> Dict[str, int]:
        out = {termination_tag(n): int(c) for n, c in zip(self.names, self._counts)}
        self._counts[:] = 0
        return out


# ---------------------------------------------------------------------------------------------
# Commands (joystick tasks): uniform targets resampled every few control steps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandTerm:
    """A command of ``len(ranges)`` channels, each uniform in its (low, high) range.

    Every env redraws it after a number of control steps drawn uniformly from
    ``resample_steps`` (inclusive), and with probability ``zero_prob`` the command is all zeros
    (standing still). Draws use the env's own generator, so env i's commands depend only on its
    seed, never on N or on the thread count.
    """

    name: str
    ranges: Tuple[Tuple[float, float], ...]
    resample_steps: Tuple[int, int] = (150, 300)
    zero_prob: float = 0.0


class CommandManager:
    def __init__(self, terms: Sequence[CommandTerm], num_envs: int):
        _check_unique(terms, "command")
        self.terms = tuple(terms)
        self.slices: Dict[str, slice] = {}
        start = 0
        for t in self.terms:
            self.slices[t.name] = slice(start, start + len(t.ranges))
            start += len(t.ranges)
        self.command = np.zeros((num_envs, start))
        self._countdown = np.zeros((len(self.terms), num_envs), dtype=np.int64)

    def get(self, name: str) -> np.ndarray:
        return self.command[:, self.slices[name]]

    def _draw(self, k: int, i: int, rng: np.random.Generator) -> None:
        t = self.terms[k]
        lo = np.array([r[0] for r in t.ranges])
        hi = np.array([r[1] for r in t.ranges])
        value = rng.uniform(lo, hi)
        if t.zero_prob > 0.0 and rng.random() < t.zero_prob:
            value[:] = 0.0
        self.command[i, self.slices[t.name]] = value
        self._countdown[k, i] = rng.integers(t.resample_steps[0], t.resample_steps[1] + 1)

    def reset(self, env_ids: Sequence[int], rngs: Sequence[np.random.Generator]) -> None:
        for i in env_ids:
            for k in range(len(self.terms)):
                self._draw(k, int(i), rngs[int(i)])

    def step(self, active: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """Count down one control step for the active envs and redraw the commands that are due."""
        if not self.terms:
            return
        self._countdown[:, active] -= 1
        for k, i in zip(*np.nonzero(self._countdown <= 0)):
            self._draw(int(k), int(i), rngs[int(i)])


# ---------------------------------------------------------------------------------------------
# Events: things done to envs at reset (initial state, domain randomisation) or every step (pushes)
# ---------------------------------------------------------------------------------------------

EVENT_MODES = ("reset", "step")


@dataclass(frozen=True)
class EventTerm:
    """``fn(env, env_ids)``; "reset" terms run on the envs being reset (in table order),
    "step" terms run on every step before physics with ``env_ids=None`` (all envs)."""

    name: str
    fn: Callable[[Any, Optional[np.ndarray]], None]
    mode: str


class EventManager:
    def __init__(self, terms: Sequence[EventTerm]):
        _check_unique(terms, "event")
        for t in terms:
            if t.mode not in EVENT_MODES:
                raise ValueError(
                    f"event term {t.name!r} has unknown mode {t.mode!r}; valid choices: "
                    f"{', '.join(EVENT_MODES)}"
                )
        self.terms = tuple(terms)

    def apply(self, mode: str, env, env_ids: Optional[np.ndarray] = None) -> None:
        for t in self.terms:
            if t.mode == mode:
                t.fn(env, env_ids)


def _check_unique(terms, kind: str) -> None:
    names = [t.name for t in terms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate {kind} term name(s): {', '.join(dup)}")
