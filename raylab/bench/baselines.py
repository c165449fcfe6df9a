"""Microduck balance: the fixed-policy baselines over several seeds and both reward versions.

    raylab bench baselines [--episodes 100] [--seeds 0 1 2 3 4] [--threads 2]
        [--out runs/bench/microduck_baselines.json] [--option KEY=VALUE ...]

Holding the stand pose (zero action) and uniform random actions, per reward version and seed:
what the task pays a policy that does nothing, the number a trained policy must beat
(docs/envs.md, Baselines). The evaluation's own hold-pose and random lines (one seed block,
the evaluation protocol, cached for the plots) are ``raylab.evaluate.baseline_scores``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

from raylab.bench.common import machine_info
from raylab.envs.robots.microduck import NUM_ACTIONS
from raylab.envs.tasks.microduck_balance import MicroduckBalanceVecEnv


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
    fallen (the task's one definition, :func:`raylab.envs.robots.microduck.is_fallen`);
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
                per_seed.append(
                    {
                        "seed": s,
                        "return_mean": float(ret.mean()),
                        "return_sd": float(ret.std()),
                        "survival": float(np.mean(alive / steps)),
                        "upright_at_end": upright_end,
                    }
                )
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="raylab bench baselines", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/bench/microduck_baselines.json")
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env option, e.g. --option push_vel_max=0.9 (repeatable)",
    )
    args = ap.parse_args(argv)
    options = dict(_parse_option(o) for o in args.option)
    command = "raylab bench baselines " + " ".join(argv if argv is not None else sys.argv[1:])
    print(command)
    t0 = time.perf_counter()
    report = run_baselines(args.episodes, args.seeds, args.threads, **options)
    for key, v in report.items():
        if "/" in key:
            print(
                f"{key:<18} return {v['return_mean_over_seeds']:7.1f} "
                f"± {v['return_sd_over_seed_means']:.1f} (sd over seed means)  "
                f"survival {v['survival']:.3f}  upright at end {v['upright_at_end']:.3f}"
            )
    report["command"] = command
    report["seconds"] = time.perf_counter() - t0
    report["machine"] = machine_info()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
