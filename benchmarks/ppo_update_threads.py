"""How long one PPO update takes on 1 torch thread and on every core, per task layout.

PPO's update runs while nobody samples, so by default it takes every core
(``algo.learner_threads``). Whether the second thread pays depends on the minibatch: torch splits
an op across threads only when it is large enough, and every op pays the threads' hand-over.
For each case (a task and overrides), this builds the PPO Algorithm with a local Learner,
trains a few warm-up iterations, then times the Learner's update with the thread counts
alternating (A B, B A, ...), each round ``--updates`` updates, and saves the median per thread
count:

    python benchmarks/ppo_update_threads.py --rounds 3 --updates 4 \
        --out benchmarks/results/ppo_update_threads.json

The cases are the PPO layouts raylab ships: the Gymnasium defaults (64-row minibatches of a
64-64 net), the HalfCheetah and Walker2d tuned ones (64 rows of 256-256, 32 rows of 64-64) and
the robot tasks' (1024 rows of 256-128). The JSON holds the times, the machine (cores, load
before and after) and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence

from raylab.bench import common as C

CASES = {
    "gym_default_mb64_64x64": ("Hopper-v5", []),
    "halfcheetah_mb64_256x256": ("HalfCheetah-v5", []),
    "walker2d_zoo_mb32_64x64": (
        "Walker2d-v5",
        ["algo.train_batch_size=512", "algo.minibatch_size=32", "algo.num_epochs=20"],
    ),
    "gym_mb256_64x64": ("Hopper-v5", ["algo.minibatch_size=256"]),
    "microduck_mb1024_256x128": ("microduck_balance", []),
}


def time_case(
    name: str, task: str, overrides: Sequence[str], threads: List[int], rounds: int, updates: int
) -> Dict[str, Any]:
    import ray

    from raylab.algorithms.build import build_algorithm_config
    from raylab.bench.train import compose_cfg

    cfg = compose_cfg("ppo", task, ["resources.num_env_runners=1", *overrides])
    config = build_algorithm_config(cfg, num_gpus_per_learner=0.0).learners(num_learners=0)
    algo = config.build_algo()
    try:
        learner = algo.learner_group._learner
        times: List[float] = []
        orig = learner.update

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                times.append(time.perf_counter() - t)

        learner.update = timed
        for _ in range(3):  # warm-up: buffers, optimizer state, the EnvRunner's first episodes
            algo.train()
        per: Dict[int, List[float]] = {t: [] for t in threads}
        for _, t in C.round_order(threads, rounds):
            learner._update_threads = t
            times.clear()
            while len(times) < updates:
                algo.train()
            per[t].extend(times[:updates])
            print(f"  {name}: {t} thread(s) {statistics.median(times) * 1000:.0f} ms", flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    med = {t: statistics.median(v) * 1000 for t, v in per.items()}
    return {
        "case": name,
        "task": task,
        "overrides": list(overrides),
        "minibatch_size": int(cfg.algo.minibatch_size),
        "hidden": list(cfg.algo.hidden),
        "update_ms": {str(t): round(v, 1) for t, v in med.items()},
        "update_ms_all": {str(t): [round(x * 1000, 1) for x in v] for t, v in per.items()},
        "speedup_all_cores": round(med[threads[0]] / med[threads[-1]], 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=C.positive(int, "--rounds"), default=3)
    p.add_argument("--updates", type=C.positive(int, "--updates"), default=4)
    p.add_argument("--out", default="benchmarks/results/ppo_update_threads.json")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    threads = sorted({1, cores})
    command = C.command_line(
        "python benchmarks/ppo_update_threads.py", sys.argv[1:] if argv is None else argv
    )
    print(command)
    check = C.machine_check(threads_needed=cores)
    C.print_check(check)
    result: Dict[str, Any] = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "params": {"cases": args.cases, "rounds": args.rounds, "updates": args.updates},
        "threads": threads,
        "machine": C.machine_info(),
        "machine_check": check,
    }
    t0 = time.perf_counter()
    rows = []
    for name in args.cases:
        task, overrides = CASES[name]
        rows.append(time_case(name, task, overrides, threads, args.rounds, args.updates))
    result["rows"] = rows
    result["duration_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    path = args.out
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for r in rows:
        print(
            f"{r['case']:28s} minibatch {r['minibatch_size']:5d} "
            + " ".join(f"{t} thr {ms:7.1f} ms" for t, ms in r["update_ms"].items())
            + f"  all cores {r['speedup_all_cores']:.2f}x"
        )
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
