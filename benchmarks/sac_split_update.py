"""SAC's update fused on one thread against split over two (``algo.split_update``), plain torch.

The SAC Learner is the bottleneck of every SAC run here (one core at 100%, the EnvRunner needs
little of the other). ``algo.split_update`` runs each update's actor half (forward and
backward) on a second thread while the critics' half runs on the first; the step is the same
(bit-identical: tests/test_sac.py). This times the update raylab ships in a plain loop
(``raylab.bench.train.torch_sac_update_rate``: the Learner's networks, fused Adam, batches
gathered from a preallocated pool, one torch thread) fused and split, in alternating windows
(A B, B A, ...), for the network and batch shapes of the SAC runs raylab documents, and saves
the medians:

    python benchmarks/sac_split_update.py --rounds 3 --seconds 8 \
        --out benchmarks/results/sac_split_update.json

The JSON holds the rates per window, the machine (cores, load before and after) and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Dict

from raylab.bench import common as C

# name: (obs dim, action dim, hidden, batch) of the documented SAC runs
CASES = {
    "halfcheetah_walker2d_256x256_b256": (17, 6, [256, 256], 256),
    "microduck_balance_256x256_b256": (48, 14, [256, 256], 256),
    "pendulum_256x256_b256": (3, 1, [256, 256], 256),
}


def main(argv=None) -> int:
    from raylab.bench.train import torch_sac_update_rate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=C.positive(int, "--rounds"), default=3)
    p.add_argument("--seconds", type=C.positive(float, "--seconds"), default=8.0)
    p.add_argument("--out", default="benchmarks/results/sac_split_update.json")
    args = p.parse_args(argv)
    command = C.command_line(
        "python benchmarks/sac_split_update.py", sys.argv[1:] if argv is None else argv
    )
    print(command)
    check = C.machine_check(threads_needed=2)
    C.print_check(check)
    result: Dict[str, Any] = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "params": {"cases": args.cases, "rounds": args.rounds, "seconds": args.seconds},
        "machine": C.machine_info(),
        "machine_check": check,
    }
    t0 = time.perf_counter()
    rows = []
    for name in args.cases:
        obs, act, hidden, batch = CASES[name]
        rates: Dict[str, list] = {"fused": [], "split": []}
        for _, side in C.round_order(list(rates), args.rounds):
            w = torch_sac_update_rate(
                obs, act, hidden, "relu", batch, args.seconds, split=side == "split"
            )
            rates[side].append(round(w["updates_per_s"], 1))
            print(f"  {name}: {side} {w['updates_per_s']:.1f} updates/s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        rows.append(
            {
                "case": name,
                "obs_dim": obs,
                "action_dim": act,
                "hidden": hidden,
                "batch_size": batch,
                "updates_per_s": med,
                "updates_per_s_all": rates,
                "split_over_fused": round(med["split"] / med["fused"], 3),
            }
        )
    result["rows"] = rows
    result["duration_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for r in rows:
        u = r["updates_per_s"]
        print(
            f"{r['case']:36s} fused {u['fused']:7.1f}  split {u['split']:7.1f} updates/s  "
            f"{r['split_over_fused']:.2f}x"
        )
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
