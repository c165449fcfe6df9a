"""Sample efficiency of raylab's SAC against RLlib's stock SAC with the same hyperparameters.

For each seed, trains raylab SAC (what `raylab train --algo sac` builds) and RLlib's own SACConfig
(`raylab.bench.train.stock_sac_config`: same network sizes, learning rates, batch, tau, initial
alpha and replay ratio) on one task, alternating which goes first, and records the learning curve
(env steps sampled, mean episode return) until the return reaches the threshold or the step
budget runs out. Speed is not the point here (see `raylab bench train --algo sac`): the result is
the env step at which each first reached the threshold.

    python benchmarks/sac_sample_efficiency.py --task Pendulum-v1 --threshold -250 \
        --max-steps 12000 --seeds 0 --out benchmarks/results/sac_pendulum_sample_efficiency.json \
        env.num_envs=1

One env per runner, as in the stock SAC this is measured against (one batch-256 update per env
step): with 16 Pendulum envs, episodes end 16 at a time every 3,200 env steps and the mean
return over the last episodes lags the policy by thousands of steps.

The JSON holds the curves, the machine (cores, load before and after) and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from raylab.bench import common as C


def learn(
    contender: str, task: str, seed: int, threshold: float, max_steps: int, overrides: Sequence[str]
) -> Dict[str, Any]:
    from raylab.bench.train import algorithm_config, compose_cfg, stop_algorithm
    from raylab.reporting import env_steps

    # Stock RLlib SAC's critic loss is the Huber loss: raylab's side uses it too (the Gymnasium
    # ids' default is the MSE), unless an override says otherwise.
    cfg = compose_cfg("sac", task, ["algo.critic_loss=huber", f"training.seed={seed}", *overrides])
    algo = algorithm_config(contender, cfg).build_algo()
    curve: List[List[float]] = []
    reached: Optional[int] = None
    t0 = time.perf_counter()
    try:
        while True:
            result = algo.train()
            steps = env_steps(result)
            ret = result.get("env_runners", {}).get("episode_return_mean")
            if ret is not None and ret == ret:  # not NaN
                curve.append([steps, round(float(ret), 2), round(time.perf_counter() - t0, 1)])
                if reached is None and ret >= threshold:
                    reached = steps
                    break
            if steps >= max_steps:
                break
    finally:
        stop_algorithm(algo, contender, cfg)
    side = "raylab_sac" if contender == "batched" else contender
    last = curve[-1] if curve else None
    print(
        f"  {side:10s} seed {seed}: "
        + (
            f"reached {threshold:g} at {reached:,} env steps"
            if reached is not None
            else f"did not reach {threshold:g} in {max_steps:,} env steps"
        )
        + (
            f" (last mean return {last[1]:.1f} at {last[0]:,} steps, {last[2]:.0f} s)"
            if last
            else ""
        ),
        flush=True,
    )
    return {
        "contender": side,
        "seed": seed,
        "reached_at_env_steps": reached,
        "wall_s": round(time.perf_counter() - t0, 1),
        "curve": curve,
    }


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--task", default="Pendulum-v1")
    p.add_argument("--threshold", type=float, default=-250.0, help="mean episode return to reach")
    p.add_argument("--max-steps", type=int, default=12000, help="env step budget per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--out", default="runs/bench/sac_sample_efficiency.json")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="raylab config overrides for both contenders",
    )
    args = p.parse_args(argv)
    command = C.command_line("python benchmarks/sac_sample_efficiency.py", argv)

    import ray

    from raylab.bench.train import compose_cfg
    from raylab.train import init_ray

    check = C.machine_check(3)
    C.print_check(check)
    result: Dict[str, Any] = {
        "kind": "sac_sample_efficiency",
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {
            "task": args.task,
            "threshold": args.threshold,
            "max_steps": args.max_steps,
            "seeds": args.seeds,
            "overrides": args.overrides,
        },
        "machine": C.machine_info(),
        "machine_check": check,
        "runs": [],
    }
    init_ray(compose_cfg("sac", args.task, args.overrides))
    try:
        for k, seed in enumerate(args.seeds):
            order = ["batched", "stock_sac"] if k % 2 == 0 else ["stock_sac", "batched"]
            for contender in order:
                result["runs"].append(
                    learn(
                        contender, args.task, seed, args.threshold, args.max_steps, args.overrides
                    )
                )
    finally:
        ray.shutdown()
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out}\nreproduce: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
