"""Env throughput: the thread sweep with reference windows, bare physics, sustained runs, and the
batched env against Gymnasium's vector envs.

``raylab bench env``      the sweep (or ``--sustained T``) of the batched env or (``--mode bare``)
                          of its physics alone; a one-thread reference window before the sweep
                          and after every row; verdict from the references (raylab.bench.common).
``raylab bench compare``  the batched env (threads) against Gymnasium's AsyncVectorEnv (one
                          process per worker, pipes) and SyncVectorEnv of the reference env,
                          under the same uniform random actions, alternating backends every
                          window.

Every contender is built and warmed up before the first measured window; construction is
never timed. All contenders replay one table of uniform random actions in [-1, 1], so the
physics does the same kind of work everywhere (a robot held still is cheaper to simulate than
one being driven).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np

from raylab.bench import common as C
from raylab.errors import UserError, choices_hint

BACKENDS = ("batched", "async", "sync")
ACTION_TABLE = 64  # action batches in the replayed table


# ---------------------------------------------------------------------------- contenders


class Contender:
    """A named step function over ``num_envs`` envs (plus what to close afterwards)."""

    def __init__(
        self,
        name: str,
        num_envs: int,
        step: Callable[[], Any],
        close=None,
        child_pids: Sequence[int] = (),
        threads: int = 1,
    ):
        self.name, self.num_envs, self.step = name, num_envs, step
        self.child_pids, self.threads = list(child_pids), threads
        self._close = close

    def window(self, seconds: float) -> Dict[str, float]:
        return C.run_window(self.step, seconds, self.num_envs, self.child_pids)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


def _action_table(num_envs: int, action_dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, size=(ACTION_TABLE, num_envs, action_dim)).astype(np.float32)


def _cycler(table: Sequence[Any]) -> Callable[[], Any]:
    k = [0]

    def nxt():
        k[0] = (k[0] + 1) % len(table)
        return table[k[0]]

    return nxt


def env_tasks() -> Dict[str, str]:
    """raylab tasks registered with a batched vector env: name -> Gymnasium id."""
    import raylab.envs  # noqa: F401  (registers the ids)
    from raylab.envs.tasks import TASKS

    out = {}
    for name, spec in TASKS.items():
        try:
            if gym.spec(spec.gym_id).vector_entry_point is not None:
                out[name] = spec.gym_id
        except gym.error.Error:
            continue
    return out


def _gym_id(task: str) -> str:
    tasks = env_tasks()
    if task not in tasks:
        raise UserError(choices_hint(task, tasks, "task with a batched backend"))
    return tasks[task]


def _check_threads(values: Sequence[int], allow_overcommit: bool) -> None:
    from raylab.envs.core.backend import check_num_threads

    for t in values:
        try:
            check_num_threads(t, allow_overcommit)
        except ValueError as e:
            raise UserError(f"{e} (--allow-overcommit)") from None


def make_batched(
    task: str,
    num_envs: int,
    threads: int,
    seed: int,
    options: Dict[str, Any],
    allow_overcommit: bool = False,
    mode: str = "full",
) -> Contender:
    """The batched env (``mode="full"``) or its physics alone (``mode="bare"``): N envs x
    ``nsubsteps`` mj_step on the same threads (the env's ``sim``, a ``BatchedMujoco``), each
    env's controls set to the servo targets the env itself computed from the same random
    actions (recorded from its ``ctrl`` before the window, so the window holds nothing but
    physics and a 14-float copy per env)."""
    gym_id = _gym_id(task)
    try:
        env = gym.make_vec(
            gym_id,
            num_envs=num_envs,
            vectorization_mode="vector_entry_point",
            num_threads=threads,
            allow_overcommit=allow_overcommit,
            **options,
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"bad env option: {str(e).splitlines()[0]}") from None
    env.reset(seed=seed)
    base = env.unwrapped
    actions = _action_table(num_envs, base.single_action_space.shape[0], seed)
    name = f"{'batched' if mode == 'full' else 'bare'} T={threads}"
    if mode == "full":
        nxt = _cycler(actions)
        return Contender(name, num_envs, lambda: env.step(nxt()), env.close, threads=threads)
    sim, ctrl = getattr(base, "sim", None), getattr(base, "ctrl", None)
    if not hasattr(sim, "bare_step") or not isinstance(ctrl, np.ndarray):
        env.close()
        raise UserError(
            f"task '{task}': its vector env has no BatchedMujoco sim / ctrl; --mode bare needs both"
        )
    # The servo targets the env computes from the same actions, one table entry per step.
    ctrls = []
    for a in actions:
        env.step(a)
        ctrls.append(np.array(ctrl, copy=True))
    nxt = _cycler(ctrls)
    return Contender(name, num_envs, lambda: sim.bare_step(nxt()), env.close, threads=threads)


class EnvGroup(gym.Env):
    """K reference envs behind one Gymnasium env, for an AsyncVectorEnv worker process that
    holds several envs: actions (K, A) in, observations (K, O) and rewards (K,) out.

    The worker autoresets its own envs (NEXT_STEP, like the batched env); its done flags stay
    in the worker, so what crosses the pipe per step is the actions out and the observations
    (shared memory) and rewards back.
    """

    def __init__(self, gym_id: str, k: int, options: Dict[str, Any]):
        self.k = k
        self.envs = [gym.make(gym_id, **options) for _ in range(k)]
        o, a = self.envs[0].observation_space, self.envs[0].action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (k, *o.shape), o.dtype)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (k, *a.shape), a.dtype)
        self._done = np.zeros(k, dtype=bool)
        self._obs = np.zeros(self.observation_space.shape, o.dtype)
        self._rew = np.zeros(k)

    def reset(self, *, seed=None, options=None):
        for i, e in enumerate(self.envs):
            self._obs[i] = e.reset(seed=None if seed is None else seed * self.k + i)[0]
        self._done[:] = False
        return self._obs.copy(), {}

    def step(self, actions):
        for i, e in enumerate(self.envs):
            if self._done[i]:
                self._obs[i], self._rew[i], self._done[i] = e.reset()[0], 0.0, False
            else:
                o, r, term, trunc, _ = e.step(actions[i])
                self._obs[i], self._rew[i], self._done[i] = o, r, term or trunc
        return self._obs.copy(), self._rew.copy(), False, False, {}

    def close(self):
        for e in self.envs:
            e.close()


def _group_factory(gym_id: str, k: int, options: Dict[str, Any]):
    return lambda: EnvGroup(gym_id, k, options)


def make_gym_vector(
    kind: str, task: str, workers: int, envs_per_worker: int, seed: int, options: Dict[str, Any]
) -> Contender:
    """Gymnasium's AsyncVectorEnv (``workers`` processes, pipes, observations in shared memory)
    or SyncVectorEnv (one process) of the reference env, ``workers x envs_per_worker`` envs."""
    gym_id = _gym_id(task)
    n = workers * envs_per_worker
    try:
        if kind == "sync":
            env = gym.make_vec(gym_id, num_envs=n, vectorization_mode="sync", **options)
            actions = _action_table(n, env.single_action_space.shape[0], seed)
            pids: List[int] = []
        elif envs_per_worker == 1:
            env = gym.make_vec(gym_id, num_envs=n, vectorization_mode="async", **options)
            actions = _action_table(n, env.single_action_space.shape[0], seed)
            pids = [p.pid for p in env.unwrapped.processes]
        else:
            fns = [_group_factory(gym_id, envs_per_worker, options) for _ in range(workers)]
            env = gym.vector.AsyncVectorEnv(fns)
            flat = _action_table(n, env.single_action_space.shape[-1], seed)
            actions = flat.reshape(ACTION_TABLE, workers, envs_per_worker, -1)
            pids = [p.pid for p in env.processes]
    except (TypeError, ValueError) as e:
        raise UserError(f"bad env option: {str(e).splitlines()[0]}") from None
    env.reset(seed=seed)
    nxt = _cycler(actions)
    return Contender(f"{kind} W={workers}", n, lambda: env.step(nxt()), env.close, pids, workers)


# ---------------------------------------------------------------------------------- sweep


def _say(msg: str) -> None:
    print(msg, flush=True)


def _summary_of(w: Dict[str, float]) -> Dict[str, float]:
    return {
        "env_steps_per_s": w["rate"],
        "env_steps_per_cpu_s": w["cpu_rate"],
        "wall_s": w["wall_s"],
        "cpu_s": w["cpu_s"],
        "steps": w["calls"],
    }


def run_sweep(
    task: str = "microduck_balance",
    threads: Sequence[int] = (1, 2),
    num_envs: int = 64,
    seconds: float = 10.0,
    ref_seconds: Optional[float] = None,
    mode: str = "full",
    with_bare: bool = False,
    warmup: float = 1.0,
    seed: int = 0,
    options: Optional[Dict[str, Any]] = None,
    allow_overcommit: bool = False,
    drift_limit: float = C.DRIFT_LIMIT,
    trend_limit: float = C.TREND_LIMIT,
    command: str = "",
) -> Dict[str, Any]:
    """A sweep over thread counts, bracketed by one-thread reference windows."""
    options = dict(options or {})
    ref_seconds = ref_seconds or seconds / 2
    _gym_id(task)  # an unknown task fails before anything runs
    _check_threads(list(threads), allow_overcommit)
    params = dict(
        task=task,
        mode=mode,
        threads=list(threads),
        num_envs=num_envs,
        seconds=seconds,
        ref_seconds=ref_seconds,
        with_bare=with_bare,
        warmup_s=warmup,
        seed=seed,
        options=options,
        allow_overcommit=allow_overcommit,
    )
    check = C.machine_check(max(threads))
    C.print_check(check)
    result = C.new_result("env_sweep", command, params, check)

    ref = make_batched(task, num_envs, 1, seed, options, allow_overcommit, mode)
    rows_c = {
        t: make_batched(task, num_envs, t, seed, options, allow_overcommit, mode) for t in threads
    }
    bare_c = {}
    if with_bare and mode == "full":
        bare_c = {
            t: make_batched(task, num_envs, t, seed, options, allow_overcommit, "bare")
            for t in threads
        }
    everything = [ref, *rows_c.values(), *bare_c.values()]
    try:
        for c in everything:
            c.window(warmup)
        refs = []

        def measure_ref(after):
            w = ref.window(ref_seconds)
            refs.append({"after_row": after, **_summary_of(w)})
            _say(f"  reference (1 thread)      {w['rate']:>10,.0f} env-steps/s")

        measure_ref(None)
        rows = []
        for i, t in enumerate(threads):
            row: Dict[str, Any] = {"threads": t}
            order = ["env", "bare"] if i % 2 == 0 else ["bare", "env"]
            for what in order:
                if what == "env":
                    w = rows_c[t].window(seconds)
                    row.update(_summary_of(w))
                    _say(f"  {rows_c[t].name:<24} {w['rate']:>10,.0f} env-steps/s")
                elif t in bare_c:
                    w = bare_c[t].window(seconds)
                    row["bare"] = _summary_of(w)
                    _say(f"  {bare_c[t].name:<24} {w['rate']:>10,.0f} env-steps/s")
            rows.append(row)
            measure_ref(i)
    finally:
        for c in everything:
            c.close()

    g = C.guard([r["env_steps_per_s"] for r in refs], drift_limit, trend_limit)
    for r, d in zip(refs, g["drifts"]):
        r["drift"] = d
    base_row = next((r for r in rows if r["threads"] == 1), None)
    for i, row in enumerate(rows):
        t = row["threads"]
        bracket = (refs[i]["env_steps_per_s"] + refs[i + 1]["env_steps_per_s"]) / 2
        base = base_row["env_steps_per_s"] if base_row else bracket
        row["per_thread"] = row["env_steps_per_s"] / t
        row["speedup"] = row["env_steps_per_s"] / base
        row["efficiency"] = row["speedup"] / t
        row["speedup_vs_ref"] = row["env_steps_per_s"] / bracket
        row["efficiency_vs_ref"] = row["speedup_vs_ref"] / t
        row["drift_after"] = refs[i + 1]["drift"]
        if "bare" in row:
            b = row["bare"]
            row["env_over_bare"] = row["env_steps_per_s"] / b["env_steps_per_s"]
            row["env_over_bare_cpu"] = row["env_steps_per_cpu_s"] / b["env_steps_per_cpu_s"]
    result["refs"] = refs
    result["rows"] = rows
    if bare_c:
        result["goals"] = {
            "env_over_bare_ge_0.9": {str(r["threads"]): r["env_over_bare"] >= 0.9 for r in rows}
        }
    return C.finish_result(result, g["verdict"], g)


def run_sustained(
    task: str = "microduck_balance",
    threads: int = 2,
    windows: int = 12,
    num_envs: int = 64,
    seconds: float = 10.0,
    ref_seconds: Optional[float] = None,
    mode: str = "full",
    warmup: float = 1.0,
    seed: int = 0,
    options: Optional[Dict[str, Any]] = None,
    allow_overcommit: bool = False,
    drift_limit: float = C.DRIFT_LIMIT,
    trend_limit: float = C.TREND_LIMIT,
    command: str = "",
) -> Dict[str, Any]:
    """Fixed threads, ``windows`` windows back to back (no pause), a reference before and after."""
    options = dict(options or {})
    ref_seconds = ref_seconds or seconds / 2
    _gym_id(task)  # an unknown task fails before anything runs
    _check_threads([threads], allow_overcommit)
    params = dict(
        task=task,
        mode=mode,
        threads=threads,
        windows=windows,
        num_envs=num_envs,
        seconds=seconds,
        ref_seconds=ref_seconds,
        warmup_s=warmup,
        seed=seed,
        options=options,
        allow_overcommit=allow_overcommit,
    )
    check = C.machine_check(threads)
    C.print_check(check)
    result = C.new_result("env_sustained", command, params, check)
    ref = make_batched(task, num_envs, 1, seed, options, allow_overcommit, mode)
    main = make_batched(task, num_envs, threads, seed, options, allow_overcommit, mode)
    try:
        ref.window(warmup)
        main.window(warmup)
        refs = [_summary_of(ref.window(ref_seconds))]
        _say(f"  reference (1 thread)      {refs[0]['env_steps_per_s']:>10,.0f} env-steps/s")
        out = []
        for k in range(windows):
            w = main.window(seconds)
            out.append({"window": k, **_summary_of(w)})
            _say(f"  window {k:>3} ({main.name})   {w['rate']:>10,.0f} env-steps/s")
        refs.append(_summary_of(ref.window(ref_seconds)))
        _say(f"  reference (1 thread)      {refs[1]['env_steps_per_s']:>10,.0f} env-steps/s")
    finally:
        ref.close()
        main.close()
    g = C.guard([r["env_steps_per_s"] for r in refs], drift_limit, trend_limit)
    for r, d in zip(refs, g["drifts"]):
        r["drift"] = d
    result["refs"] = refs
    result["windows"] = out
    result["summary"] = sustained_summary([w["env_steps_per_s"] for w in out])
    result["window_trends"] = C.find_trends([w["env_steps_per_s"] for w in out], trend_limit)
    return C.finish_result(result, g["verdict"], g)


def sustained_summary(rates: Sequence[float]) -> Dict[str, Any]:
    """Peak, minimum, the band of the second half, the last three windows against the peak."""
    r = np.asarray(rates, dtype=float)
    half = r[len(r) // 2 :] if len(r) > 1 else r
    last3 = float(r[-3:].mean())
    return {
        "peak": float(r.max()),
        "peak_window": int(r.argmax()),
        "min": float(r.min()),
        "mean": float(r.mean()),
        "second_half_band": [float(half.min()), float(half.max())],
        "second_half_spread": float(half.max() / half.min() - 1.0),
        "last3_mean": last3,
        "last3_vs_peak": last3 / float(r.max()) - 1.0,
    }


# ---------------------------------------------------------------------------------- compare


def default_workers() -> List[int]:
    return [w for w in (1, 2, 4, 8) if w <= C.usable_cores()] or [1]


def run_compare(
    task: str = "microduck_balance",
    workers: Optional[Sequence[int]] = None,
    envs_per_worker: int = 1,
    seconds: float = 5.0,
    rounds: int = 3,
    backends: Sequence[str] = BACKENDS,
    warmup: float = 1.0,
    seed: int = 0,
    options: Optional[Dict[str, Any]] = None,
    allow_overcommit: bool = False,
    drift_limit: float = C.DRIFT_LIMIT,
    trend_limit: float = C.TREND_LIMIT,
    command: str = "",
) -> Dict[str, Any]:
    """Backends x worker counts, one window each per round, order reversed every other round."""
    options = dict(options or {})
    workers = list(workers or default_workers())
    _gym_id(task)  # an unknown task fails before anything runs
    _check_threads(workers, allow_overcommit)
    for b in backends:
        if b not in BACKENDS:
            raise UserError(choices_hint(b, BACKENDS, "backend"))
    params = dict(
        task=task,
        workers=workers,
        envs_per_worker=envs_per_worker,
        seconds=seconds,
        rounds=rounds,
        backends=list(backends),
        warmup_s=warmup,
        seed=seed,
        options=options,
        allow_overcommit=allow_overcommit,
    )
    check = C.machine_check(max(workers))
    C.print_check(check)
    result = C.new_result("compare", command, params, check)
    contenders: Dict[tuple, Contender] = {}
    try:
        # Worker processes first: fork before this process starts physics threads.
        if "async" in backends:
            for w in workers:
                contenders[(w, "async")] = make_gym_vector(
                    "async", task, w, envs_per_worker, seed, options
                )
        for w in workers:
            n = w * envs_per_worker
            if "sync" in backends:
                contenders[(w, "sync")] = make_gym_vector(
                    "sync", task, w, envs_per_worker, seed, options
                )
            if "batched" in backends:
                contenders[(w, "batched")] = make_batched(
                    task, n, w, seed, options, allow_overcommit
                )
        order = [(w, b) for w in workers for b in backends]
        for key in order:
            contenders[key].window(warmup)
        windows: Dict[tuple, List[Dict[str, float]]] = {k: [] for k in order}
        for r, key in C.round_order(order, rounds):
            w = contenders[key].window(seconds)
            windows[key].append(_summary_of(w))
            _say(
                f"  round {r}  {key[1]:<8} W={key[0]:<2} {w['rate']:>10,.0f} env-steps/s"
                f"  ({w['cpu_rate']:,.0f} per CPU-s)"
            )
    finally:
        for c in contenders.values():
            c.close()

    rows = []
    for (w, b), ws in windows.items():
        rates = [x["env_steps_per_s"] for x in ws]
        rows.append(
            {
                "workers": w,
                "backend": b,
                "num_envs": w * envs_per_worker,
                "env_steps_per_s": float(np.median(rates)),
                "env_steps_per_cpu_s": float(np.median([x["env_steps_per_cpu_s"] for x in ws])),
                "windows": rates,
                "guard": C.guard(rates, drift_limit, trend_limit),
            }
        )
    by = {(r["workers"], r["backend"]): r for r in rows}
    for r in rows:
        one = by.get((min(workers), r["backend"]))
        if one is not None and min(workers) == 1:
            r["efficiency"] = r["env_steps_per_s"] / (r["workers"] * one["env_steps_per_s"])
    ratios = {}
    for w in workers:
        entry: Dict[str, Any] = {}
        if "batched" not in backends:
            break
        for other in ("async", "sync"):
            if other not in backends:
                continue
            per_round = [
                a["env_steps_per_s"] / b["env_steps_per_s"]
                for a, b in zip(windows[(w, "batched")], windows[(w, other)])
            ]
            entry[f"batched_over_{other}"] = float(np.median(per_round))
            entry[f"batched_over_{other}_per_round"] = per_round
            entry[f"batched_over_{other}_cpu"] = (
                by[(w, "batched")]["env_steps_per_cpu_s"] / by[(w, other)]["env_steps_per_cpu_s"]
            )
        if "batched_over_async" in entry:
            entry["goal_batched_ge_2x_async"] = entry["batched_over_async"] >= 2.0
        ratios[str(w)] = entry
    result["rows"] = rows
    result["ratios"] = ratios
    ref_key = (min(workers), "batched" if "batched" in backends else backends[0])
    g = C.guard([x["env_steps_per_s"] for x in windows[ref_key]], drift_limit, trend_limit)
    g["reference"] = f"{ref_key[1]} W={ref_key[0]}"
    return C.finish_result(result, g["verdict"], g)


# ---------------------------------------------------------------------------------- CLI


def _common_args(p) -> None:
    p.add_argument(
        "--task",
        default="microduck_balance",
        help=f"task with a batched backend: {', '.join(env_tasks())}",
    )
    p.add_argument(
        "--seconds",
        type=C.positive(float, "seconds"),
        default=10.0,
        help="seconds per measured window",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds each contender runs before the first measured window",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the envs and the action table")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env option, e.g. --option push_vel_max=0.9 (repeatable)",
    )
    p.add_argument(
        "--allow-overcommit",
        action="store_true",
        help="allow more threads / workers than the thread limit (min(8, cores))",
    )
    p.add_argument(
        "--drift-limit",
        type=float,
        default=C.DRIFT_LIMIT,
        help="unstable when a reference differs from the first by more than this",
    )
    p.add_argument(
        "--trend-limit",
        type=float,
        default=C.TREND_LIMIT,
        help="trending when 3 consecutive references move one way by more than this",
    )
    p.add_argument(
        "--out",
        default=None,
        help="result JSON; None: runs/bench/<env_sweep_MODE|env_sustained_MODE|compare>.json",
    )


def env_parser():
    p = C.BenchParser(
        prog="raylab bench env",
        description="Env-steps/s of the batched env over a thread sweep, with a one-thread "
        "reference window before the sweep and after every row (verdict: stable, trending "
        "or unstable), or --sustained T: T threads for --windows windows back to back.",
        formatter_class=C.BenchFormatter,
    )
    p.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="thread counts of the sweep"
    )
    p.add_argument(
        "--num-envs", type=C.positive(int, "num-envs"), default=64, help="envs in the batched env"
    )
    p.add_argument(
        "--ref-seconds",
        type=C.positive(float, "ref-seconds"),
        default=None,
        help="seconds per reference window; None: half of --seconds",
    )
    p.add_argument(
        "--mode",
        choices=("full", "bare"),
        default="full",
        help="full: the whole env step; bare: physics only (N x 10 mj_step on the same threads)",
    )
    p.add_argument(
        "--with-bare",
        action="store_true",
        help="full mode: also a bare-physics window at each row's thread count, "
        "next to the env's (env/bare ratio from adjacent windows)",
    )
    p.add_argument(
        "--sustained",
        type=int,
        default=None,
        metavar="T",
        help="sustained mode with T threads: --windows windows with no pause; None: the sweep",
    )
    p.add_argument(
        "--windows",
        type=C.positive(int, "windows"),
        default=12,
        help="windows of the sustained mode",
    )
    _common_args(p)
    return p


def compare_parser():
    p = C.BenchParser(
        prog="raylab bench compare",
        description="The batched env (threads) against Gymnasium AsyncVectorEnv (one process "
        "per worker, pipes) and SyncVectorEnv of the reference env, same random actions, "
        "backends alternated window by window; ratios per round and their median.",
        formatter_class=C.BenchFormatter,
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=default_workers(),
        help="worker counts: threads of the batched env, processes of AsyncVectorEnv "
        "(default: 1, 2, 4, 8 up to this machine's cores)",
    )
    p.add_argument(
        "--envs-per-worker",
        type=C.positive(int, "envs-per-worker"),
        default=1,
        help="envs per worker (num_envs = workers x this); above 1, each async "
        "worker process steps a group of reference envs",
    )
    p.add_argument(
        "--rounds",
        type=C.positive(int, "rounds"),
        default=3,
        help="windows per contender (one per round)",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=list(BACKENDS),
        help=f"backends to measure: {', '.join(BACKENDS)}",
    )
    _common_args(p)
    p.set_defaults(seconds=5.0)
    return p


def _print_sweep(res: Dict[str, Any]) -> None:
    bare = any("bare" in r for r in res["rows"])
    head = (
        f"{'threads':>7} {'env-steps/s':>12} {'per thread':>11} {'speed-up':>9} "
        f"{'efficiency':>10} {'ref drift':>9}"
    )
    if bare:
        head += f" {'bare':>10} {'env/bare':>8}"
    print(head)
    for r in res["rows"]:
        line = (
            f"{r['threads']:>7} {r['env_steps_per_s']:>12,.0f} {r['per_thread']:>11,.0f} "
            f"{r['speedup']:>8.2f}x {r['efficiency']:>10.0%} {C.fmt_pct(r['drift_after']):>9}"
        )
        if "bare" in r:
            line += f" {r['bare']['env_steps_per_s']:>10,.0f} {r['env_over_bare']:>8.3f}"
        print(line)


def _print_verdict(res: Dict[str, Any]) -> None:
    g = res["guard"]
    extra = ""
    if g.get("trends"):
        t = g["trends"][0]
        extra = f"; trend {t['change']:+.1%} over references {t['start']}-{t['end']}"
    print(
        f"verdict: {res['verdict']} (max reference drift {g['max_abs_drift']:.1%} against "
        f"{g['drift_limit']:.0%}{extra}); load average before "
        f"{res['machine_check']['loadavg'][0]:.2f}, "
        f"after {res['loadavg_after'][0]:.2f}, {res['machine']['usable_cores']} core(s)"
    )


def main_env(argv: Sequence[str]) -> int:
    args = env_parser().parse_args(list(argv))
    options = C.parse_options(args.option)
    command = C.command_line("raylab bench env", argv)
    print(command, flush=True)
    common = dict(
        task=args.task,
        num_envs=args.num_envs,
        seconds=args.seconds,
        ref_seconds=args.ref_seconds,
        mode=args.mode,
        warmup=args.warmup,
        seed=args.seed,
        options=options,
        allow_overcommit=args.allow_overcommit,
        drift_limit=args.drift_limit,
        trend_limit=args.trend_limit,
        command=command,
    )
    if args.sustained is not None:
        res = run_sustained(threads=args.sustained, windows=args.windows, **common)
        s = res["summary"]
        print(
            f"sustained T={args.sustained}: peak {s['peak']:,.0f} (window {s['peak_window']}), "
            f"min {s['min']:,.0f}, second half {s['second_half_band'][0]:,.0f}-"
            f"{s['second_half_band'][1]:,.0f} ({s['second_half_spread']:.0%} band), "
            f"last 3 {s['last3_mean']:,.0f} ({s['last3_vs_peak']:+.1%} vs peak)"
        )
        default_out = f"runs/bench/env_sustained_{args.mode}.json"
    else:
        res = run_sweep(threads=args.threads, with_bare=args.with_bare, **common)
        _print_sweep(res)
        default_out = f"runs/bench/env_sweep_{args.mode}.json"
    _print_verdict(res)
    path = C.save_result(res, args.out or default_out)
    print(f"wrote {path}")
    return 0


def main_compare(argv: Sequence[str]) -> int:
    args = compare_parser().parse_args(list(argv))
    options = C.parse_options(args.option)
    command = C.command_line("raylab bench compare", argv)
    print(command, flush=True)
    res = run_compare(
        task=args.task,
        workers=args.workers,
        envs_per_worker=args.envs_per_worker,
        seconds=args.seconds,
        rounds=args.rounds,
        backends=args.backends,
        warmup=args.warmup,
        seed=args.seed,
        options=options,
        allow_overcommit=args.allow_overcommit,
        drift_limit=args.drift_limit,
        trend_limit=args.trend_limit,
        command=command,
    )
    print(
        f"{'workers':>7} {'envs':>5} {'backend':<8} {'env-steps/s':>12} {'per CPU-s':>10} "
        f"{'efficiency':>10}  windows"
    )
    for r in res["rows"]:
        eff = f"{r['efficiency']:.0%}" if "efficiency" in r else "-"
        ws = ", ".join(f"{x:,.0f}" for x in r["windows"])
        print(
            f"{r['workers']:>7} {r['num_envs']:>5} {r['backend']:<8} "
            f"{r['env_steps_per_s']:>12,.0f} "
            f"{r['env_steps_per_cpu_s']:>10,.0f} {eff:>10}  {ws}"
        )
    for w, e in res["ratios"].items():
        parts = [
            f"{k.replace('_over_', '/')} {v:.2f}x"
            for k, v in e.items()
            if k.startswith("batched_over_") and not k.endswith(("_per_round", "_cpu"))
        ]
        cpu = [
            f"{k[:-4].replace('_over_', '/')} {v:.2f}x" for k, v in e.items() if k.endswith("_cpu")
        ]
        print(
            f"W={w}: "
            + ", ".join(parts)
            + " (median of per-round ratios); per CPU-s: "
            + ", ".join(cpu)
        )
    _print_verdict(res)
    path = C.save_result(res, args.out or "runs/bench/compare.json")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main_env(sys.argv[1:]))
