"""Microduck balance: first throughput numbers and the fixed-policy baselines.

    python -m raylab.envs.microduck_bench throughput [--num-envs 64] [--threads 1 2]
        [--window 1.5] [--rounds 10] [--out runs/bench/microduck_throughput.json]
    python -m raylab.envs.microduck_bench baselines [--episodes 100] [--seeds 0 1 2 3 4]
        [--out runs/bench/microduck_baselines.json] [--option KEY=VALUE ...]

Throughput (env-steps/s), measured in alternating windows within one run so a machine that
changes state biases every contender the same way:

- ``batched``: ``MicroduckBalanceVecEnv`` (info_mode="none", NEXT_STEP autoreset), uniform
  random actions, N envs on T threads: everything a training step pays on the env side;
- ``bare``: physics alone, ``N x 10 mj_step`` on the same threads, on the same env's models
  and data, with each env's ctrl set to the servo targets of the same kind of random actions
  (so the physics does the same work as under ``batched``: a robot holding still is cheaper
  to simulate than one being driven);
- ``sync``: ``gymnasium.vector.SyncVectorEnv`` of N reference envs
  (``gym.make_vec(..., vectorization_mode="sync")``), one thread.

This is a quick three-way look at one machine state. The benchmark protocol (reference windows
before a sweep and after every row, drift and trend guards, bare and sustained modes, the
machine check, Gymnasium's AsyncVectorEnv, end-to-end training) is ``raylab bench env |
compare | train | plot`` (``raylab/bench_env.py``, ``bench_train.py``, ``benchmarks/README.md``);
the window timing and the machine description here are that suite's (``raylab.bench_common``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np

import raylab.envs  # noqa: F401  (registers the Gymnasium ids)
from raylab.bench_common import machine_info, run_window
from raylab.envs.microduck import NUM_ACTIONS
from raylab.envs.microduck_vec import MicroduckBalanceVecEnv

GYM_ID = "raylab/MicroduckBalance-v0"


def _machine() -> Dict[str, Any]:
    return machine_info()


def _window(step, num_envs: int, seconds: float):
    """Run ``step`` for ``seconds`` of wall time; return (env-steps per wall second, env-steps
    per CPU second of this process). The CPU rate is the cost of the work itself and is much
    less sensitive to other processes competing for the cores."""
    w = run_window(step, seconds, num_envs)
    return w["rate"], w["cpu_rate"]


def measure_throughput(
    num_envs: int = 64,
    threads: Sequence[int] = (1, 2),
    window: float = 1.5,
    rounds: int = 10,
    seed: int = 0,
    allow_overcommit: bool = False,
    **options,
) -> Dict[str, Any]:
    """Env-steps/s of batched, bare and SyncVectorEnv, alternating windows; returns a dict."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.0, 1.0, size=(256, num_envs, NUM_ACTIONS)).astype(np.float32)
    counter = {"k": 0}

    def next_actions():
        counter["k"] = (counter["k"] + 1) % len(actions)
        return actions[counter["k"]]

    contenders = {}
    for t in threads:
        env = MicroduckBalanceVecEnv(
            num_envs=num_envs, num_threads=t, allow_overcommit=allow_overcommit, **options
        )
        env.reset(seed=seed)

        def bare(env=env):
            # The servo targets the env would compute from the same actions (no latency).
            a = next_actions().astype(np.float64)
            target = np.clip(env.stand + env.action_scale * a, env.lower, env.upper)
            env.sim.bare_step(target)

        contenders[f"batched T={t}"] = (env, lambda env=env: env.step(next_actions()))
        contenders[f"bare T={t}"] = (env, bare)
    sync = gym.make_vec(GYM_ID, num_envs=num_envs, vectorization_mode="sync", **options)
    sync.reset(seed=seed)
    contenders["sync"] = (sync, lambda: sync.step(next_actions()))

    machine_before = _machine()
    for _, step in contenders.values():  # warm up every contender once
        _window(step, num_envs, min(1.0, window))
    windows: List[Dict[str, Any]] = []
    t_start = time.time()
    for r in range(rounds):
        names = list(contenders)
        if r % 2:
            names.reverse()
        for name in names:
            rate, cpu_rate = _window(contenders[name][1], num_envs, window)
            windows.append({"round": r, "contender": name, "env_steps_per_s": rate,
                            "env_steps_per_cpu_s": cpu_rate, "t": time.time() - t_start})  # fmt: skip
    machine_after = _machine()
    for env, _ in {id(e): (e, s) for e, s in contenders.values()}.values():
        env.close()

    def median_of(key):
        return {
            name: float(np.median([w[key] for w in windows if w["contender"] == name]))
            for name in contenders
        }

    median, median_cpu = median_of("env_steps_per_s"), median_of("env_steps_per_cpu_s")
    # Ratios per round (windows of one round are seconds apart, so a machine whose load
    # changes during the run distorts a round's ratio less than a ratio of medians), then their
    # median over rounds.
    rate = {(w["round"], w["contender"]): w["env_steps_per_s"] for w in windows}
    cpu = {(w["round"], w["contender"]): w["env_steps_per_cpu_s"] for w in windows}
    ratios = {}
    for t in threads:
        b, bare, sync = f"batched T={t}", f"bare T={t}", "sync"
        over_bare = [rate[(r, b)] / rate[(r, bare)] for r in range(rounds)]
        over_sync = [rate[(r, b)] / rate[(r, sync)] for r in range(rounds)]
        ratios[f"T={t}"] = {
            "batched_over_bare_per_round": over_bare,
            "batched_over_sync_per_round": over_sync,
            "batched_over_bare": float(np.median(over_bare)),
            "batched_over_sync": float(np.median(over_sync)),
            # the same ratios from CPU time (the cost of the work, whatever else runs)
            "cpu_batched_over_bare": float(np.median([cpu[(r, b)] / cpu[(r, bare)] for r in range(rounds)])),
            "cpu_batched_over_sync": float(np.median([cpu[(r, b)] / cpu[(r, sync)] for r in range(rounds)])),
            "goal_batched_ge_0.9_bare": bool(np.median(over_bare) >= 0.9),
            "goal_batched_ge_2.5_sync": bool(np.median(over_sync) >= 2.5),
        }
    return {
        "num_envs": num_envs,
        "threads": list(threads),
        "window_s": window,
        "rounds": rounds,
        "options": options,
        "median_env_steps_per_s": median,
        "median_env_steps_per_cpu_s": median_cpu,
        "ratios": ratios,
        "windows": windows,
        "machine_before": machine_before,
        "machine_after": machine_after,
    }


def run_baselines(
    episodes: int = 100,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    num_threads: int = 2,
    allow_overcommit: bool = False,
    **options,
) -> Dict[str, Any]:
    """Returns of fixed policies: hold the stand pose (action 0) and uniform random actions.

    For each reward version, policy and seed: ``episodes`` envs reset with ``seed * 1000`` (env
    i gets ``seed * 1000 + i``), one full episode each. Survival is the fraction of steps not
    fallen (the task's one definition, :func:`raylab.envs.microduck.is_fallen`);
    ``upright_at_end`` the fraction of episodes whose last step is not fallen.
    """
    out: Dict[str, Any] = {"episodes_per_seed": episodes, "seeds": list(seeds), "options": options}
    for version in ("v1", "v2"):
        for policy in ("hold_pose", "random"):
            per_seed = []
            for s in seeds:
                env = MicroduckBalanceVecEnv(
                    num_envs=episodes,
                    num_threads=num_threads,
                    allow_overcommit=allow_overcommit,
                    info_mode="full",
                    reward_version=version,
                    **options,
                )
                rng = np.random.default_rng(10_000 + s)
                env.reset(seed=s * 1000)
                ret = np.zeros(episodes)
                alive = np.zeros(episodes)
                steps = env.episode_steps
                for _ in range(steps):
                    if policy == "hold_pose":
                        a = np.zeros((episodes, NUM_ACTIONS))
                    else:
                        a = rng.uniform(-1.0, 1.0, size=(episodes, NUM_ACTIONS))
                    _, r, _, trunc, info = env.step(a)
                    ret += r
                    alive += ~info["fallen"]
                assert trunc.all()
                upright_end = float(np.mean(~info["fallen"]))
                env.close()
                per_seed.append({"seed": s, "return_mean": float(ret.mean()),
                                 "return_sd": float(ret.std()),
                                 "survival": float(np.mean(alive / steps)),
                                 "upright_at_end": upright_end})  # fmt: skip
            means = np.array([p["return_mean"] for p in per_seed])
            out[f"{version}/{policy}"] = {
                "return_mean_over_seeds": float(means.mean()),
                "return_sd_over_seed_means": float(means.std(ddof=1)) if len(means) > 1 else 0.0,
                "survival": float(np.mean([p["survival"] for p in per_seed])),
                "upright_at_end": float(np.mean([p["upright_at_end"] for p in per_seed])),
                "per_seed": per_seed,
            }
    return out


def _parse_option(text: str):
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--option {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a plain string such as v1


def _write(report: Dict[str, Any], path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raylab.envs.microduck_bench")
    sub = ap.add_subparsers(dest="what", required=True)
    tp = sub.add_parser("throughput", help="batched vs bare physics vs SyncVectorEnv")
    tp.add_argument("--num-envs", type=int, default=64)
    tp.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    tp.add_argument("--window", type=float, default=1.5, help="seconds per window")
    tp.add_argument("--rounds", type=int, default=10)
    tp.add_argument("--allow-overcommit", action="store_true")
    tp.add_argument("--out", default="runs/bench/microduck_throughput.json")
    bp = sub.add_parser("baselines", help="hold-pose and random-action returns, v1 and v2")
    bp.add_argument("--episodes", type=int, default=100)
    bp.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    bp.add_argument("--threads", type=int, default=2)
    bp.add_argument("--out", default="runs/bench/microduck_baselines.json")
    for p in (tp, bp):
        p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="env option, e.g. --option push_vel_max=0.9 (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    options = dict(_parse_option(o) for o in args.option)
    command = "python -m raylab.envs.microduck_bench " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print(command)
    t0 = time.perf_counter()
    if args.what == "throughput":
        report = measure_throughput(
            args.num_envs, args.threads, args.window, args.rounds,
            allow_overcommit=args.allow_overcommit, **options,
        )  # fmt: skip
        print(f"{'contender':<14} {'env-steps/s':>12} {'env-steps/CPU-s':>16}   (medians of windows)")
        for name, rate in report["median_env_steps_per_s"].items():
            print(f"{name:<14} {rate:>12,.0f} {report['median_env_steps_per_cpu_s'][name]:>16,.0f}")
        for t, r in report["ratios"].items():
            per_round = ", ".join(f"{x:.2f}" for x in r["batched_over_bare_per_round"])
            per_round_sync = ", ".join(f"{x:.2f}" for x in r["batched_over_sync_per_round"])
            print(f"{t}: batched/bare {r['batched_over_bare']:.3f} (rounds: {per_round}), "
                  f"batched/sync {r['batched_over_sync']:.2f} (rounds: {per_round_sync}); "
                  f"CPU-time ratios {r['cpu_batched_over_bare']:.3f} / {r['cpu_batched_over_sync']:.2f}")  # fmt: skip
        print(f"load average before {report['machine_before']['loadavg']}, after "
              f"{report['machine_after']['loadavg']}, cores {os.cpu_count()}")  # fmt: skip
    else:
        report = run_baselines(args.episodes, args.seeds, args.threads, **options)
        for key, v in report.items():
            if "/" in key:
                print(f"{key:<18} return {v['return_mean_over_seeds']:7.1f} "
                      f"± {v['return_sd_over_seed_means']:.1f} (sd over seed means)  "
                      f"survival {v['survival']:.3f}  upright at end {v['upright_at_end']:.3f}")  # fmt: skip
    report["command"] = command
    report["seconds"] = time.perf_counter() - t0
    report["machine"] = _machine()
    _write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
