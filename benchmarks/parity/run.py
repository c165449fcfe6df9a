"""raylab PPO / SAC on Gymnasium MuJoCo ids against the reference implementations' returns.

    python benchmarks/parity/run.py --algo ppo --tasks HalfCheetah-v5 Walker2d-v5 \
        --steps 1000000 --seeds 0 1 [-- KEY=VALUE ...]
    python benchmarks/parity/run.py --report

A run per (algo, task, seed): ``raylab train`` with ``training.total_steps`` = ``--steps`` and no
evaluation (the reference figures are training returns), into ``runs/parity/NAME`` (ignored by
git; its log next to it), NAME = ``<algo>_<task>_s<seed>`` plus ``--tag``. Its training return
curve is read back from the run's event files: ``Train/mean_reward``, raylab's mean over the
latest 100 episodes (``training.reward_window``), the reference's definition too. Saved to
``benchmarks/parity/results/NAME.json`` with the command, the overrides, the wall time and the
machine (cores, load before and after, what else was busy).

``--report`` reads every saved result and prints the parity table (task, algorithm, steps,
raylab mean +/- sd over seeds at each reference point, the reference, wall time per run against
the reference's) into ``benchmarks/parity/results/table.md``, and draws one plot per task and
algorithm (``<algo>_<task>.png``): raylab's curve per seed and the reference's points (+/-10%,
the accuracy they were read with). The reference figures and their source:
``benchmarks/parity/references.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RUNS = REPO / "runs" / "parity"
RESULTS = HERE / "results"
RAYLAB = str(Path(sys.executable).with_name("raylab"))


def references() -> Dict[str, Dict[str, dict]]:
    data = json.loads((HERE / "references.json").read_text())
    data.pop("_about", None)
    return data


def family(task: str) -> str:
    """``HalfCheetah-v5`` -> ``HalfCheetah`` (the references are per task, any version)."""
    return task.split("-v")[0]


def curve_of(run: Path) -> List[List[float]]:
    """[(env steps, Train/mean_reward)] of a run, from its event files."""
    from raylab.metrics import schema as S
    from raylab.metrics.extract import extract

    return [[int(step), float(value)] for step, value in extract(run).column(S.TRAIN_MEAN_REWARD)]


def value_at(curve: List[List[float]], step: int) -> Optional[float]:
    """The training return logged last at or before ``step`` (None before the first one, or
    when the run stopped more than 2% short of it)."""
    before = [v for s, v in curve if s <= step]
    if not before or curve[-1][0] < 0.98 * step:
        return None
    return before[-1]


def train_one(algo: str, task: str, seed: int, steps: int, tag: str, overrides: List[str]) -> dict:
    from raylab.bench.common import busy_processes, machine_info

    name = f"{algo}_{task}_s{seed}{tag}"
    run = RUNS / name
    if run.exists():
        raise SystemExit(f"{run} exists; remove it or pass another --tag")
    RUNS.mkdir(parents=True, exist_ok=True)
    train = [
        RAYLAB,
        "train",
        "--algo",
        algo,
        "--task",
        task,
        f"training.log_dir={run}",
        f"training.seed={seed}",
        f"training.total_steps={steps}",
        "training.time_budget_s=null",
        "training.eval_every=0",
        "training.eval_before_train=false",
        "training.terminal=plain",
        "resources.dashboard=false",
        *overrides,
    ]
    print(f"== {' '.join(shlex.quote(x) for x in train)}", flush=True)
    before = {"machine": machine_info(), "busy": busy_processes()}
    t0 = time.time()
    with open(RUNS / f"{name}.log", "w") as log:
        rc = subprocess.run(train, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    summary = json.loads((run / "run_summary.json").read_text())
    curve = curve_of(run)
    result = {
        "name": name,
        "command": "python " + " ".join(shlex.quote(x) for x in sys.argv),
        "train_command": train[1:],
        "overrides": overrides,
        "returncode": rc,
        "algo": algo,
        "task": task,
        "seed": seed,
        "steps": steps,
        "wall_s": round(wall, 1),
        "time_total_s": summary.get("time_total_s"),
        "env_steps": summary.get("env_steps"),
        "status": summary.get("status"),
        "curve": curve,
        "machine_before": before["machine"],
        "busy_at_start": before["busy"],
        "machine_after": machine_info(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    final = curve[-1][1] if curve else float("nan")
    print(
        f"== {name}: {result['env_steps']:,} env steps in {wall / 60:.1f} min, training return "
        f"{final:.0f}; {RESULTS / (name + '.json')}",
        flush=True,
    )
    return result


def report() -> str:
    refs = references()
    groups: Dict[tuple, List[dict]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        if "curve" not in r:
            continue
        key = (r["algo"], r["task"], tuple(r.get("overrides") or ()))
        groups.setdefault(key, []).append(r)
    lines = [
        "| task | algorithm | overrides | env steps | raylab (mean +/- sd, seeds) | reference "
        "| raylab wall time per run | reference wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (algo, task, overrides), runs in sorted(groups.items()):
        ref = refs.get(algo, {}).get(family(task), {})
        points = sorted(int(s) for s in ref.get("curve", {})) or [max(r["steps"] for r in runs)]
        for step in points:
            values = [v for v in (value_at(r["curve"], step) for r in runs) if v is not None]
            if not values:
                continue
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            walls = [r["wall_s"] * step / max(r["env_steps"], 1) / 60 for r in runs]
            ref_value = ref.get("curve", {}).get(str(step))
            ref_wall = ref.get("wall_min_per_1M")
            lines.append(
                f"| {task} | {algo} | {' '.join(overrides) or 'defaults'} | {step:,} "
                f"| {statistics.mean(values):,.0f} +/- {sd:,.0f} ({len(values)}) "
                f"| {f'{ref_value:,}' if ref_value is not None else '-'} "
                f"| {statistics.mean(walls):.1f} min "
                f"| {f'{ref_wall * step / 1e6:.1f} min' if ref_wall else '-'} |"
            )
        _plot(algo, task, overrides, runs, ref)
    table = "\n".join(lines) + "\n"
    (RESULTS / "table.md").write_text(table)
    return table


def _plot(algo: str, task: str, overrides: tuple, runs: List[dict], ref: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        steps, values = zip(*r["curve"]) if r["curve"] else ((), ())
        ax.plot(steps, values, lw=1.2, label=f"raylab seed {r['seed']}")
    points = sorted((int(s), v) for s, v in ref.get("curve", {}).items())
    if points:
        xs, ys = zip(*points)
        ax.errorbar(
            xs,
            ys,
            yerr=[0.1 * y for y in ys],
            fmt="ks",
            ms=4,
            capsize=3,
            label="reference (read off its plot, +/-10%)",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return (last 100 episodes)")
    title = f"{algo.upper()} {task}" + (f" ({' '.join(overrides)})" if overrides else "")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    suffix = (
        "" if not overrides else "_" + hashlib.sha1(" ".join(overrides).encode()).hexdigest()[:6]
    )
    fig.savefig(RESULTS / f"{algo}_{task}{suffix}.png", dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=("ppo", "appo", "sac"))
    p.add_argument("--tasks", nargs="+", default=[])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--tag", default="", help="appended to each run's name")
    p.add_argument("--report", action="store_true", help="table and plots of the saved results")
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    sys.path.insert(0, str(REPO))
    if not a.report:
        if not a.algo or not a.tasks:
            p.error("--algo and --tasks are needed to train (or --report)")
        for task in a.tasks:
            for seed in a.seeds:
                train_one(a.algo, task, seed, a.steps, a.tag, overrides)
    print(report(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
