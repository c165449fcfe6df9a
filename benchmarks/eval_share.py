"""Evaluation's share of training runs' wall time, read from their event files; or measured
as what it costs training, by training with it and without.

    python benchmarks/eval_share.py RUN_DIR [RUN_DIR ...] [--out benchmarks/eval_share.json]
    python benchmarks/eval_share.py --compare [--rounds 2] [--keep runs/eval_share] \
        [--out benchmarks/results/eval_share_compare.json] [-- raylab train overrides]

Per run: the evaluations (``Perf/evaluation_ms``, one per evaluation, the initial one included),
their total, the run's wall time (``time_total_s`` of ``run_summary.json``), the share, the
mean interval between evaluations and the ``training.eval_every`` the run used.

``--compare`` runs ``raylab train`` with the defaults of ``make train`` (and the overrides after
``--``) three ways, one after the other in each round: evaluation off
(``training.eval_every=0 training.eval_before_train=false``), in line
(``training.eval_background=false``) and beside training (the default). Reported per run: the
drop of ``Perf/total_fps`` on the iterations during which an evaluation ran (from the report's
wall time back by ``Perf/evaluation_ms``; the first 20 s of a run left out) against the run's
other iterations; the in-run cost (``in_run_cost``): the initial evaluation's time plus the
windows' length times that drop, over the run's wall time; and the env steps against the same
round's run without evaluation (``cost_vs_off``: host speed drifts by more than an evaluation
costs between runs minutes apart, so this one is noisy). ``--analyse-only`` reads the kept runs
again. Saved as JSON with the command, the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def share(run: Path) -> dict:
    from raylab.metrics import schema as S
    from raylab.metrics.extract import extract

    table = extract(run)
    evals = table.column(S.PERF_EVALUATION_MS) if S.PERF_EVALUATION_MS in table.tags else []
    summary = json.loads((run / "run_summary.json").read_text())
    config = json.loads((run / "run_config.json").read_text())
    wall = float(summary["time_total_s"])
    seconds = [v / 1000.0 for _, v in evals]
    return {
        "run": str(run),
        "algo": config["algo"]["name"],
        "task": config["task"],
        "eval_every": config["training"]["eval_every"],
        "eval_episodes": config["training"]["eval_episodes"],
        "evaluations": len(seconds),
        "eval_s": round(sum(seconds), 1),
        "each_s": [round(s, 2) for s in seconds],
        "wall_s": round(wall, 1),
        "share": round(sum(seconds) / wall, 4),
        "interval_s": round(wall / max(1, len(seconds) - 1), 1) if len(seconds) > 1 else None,
    }


WARMUP_S = 20.0  # iterations of a run's first seconds are left out of the Steps/s comparison
VARIANTS = {
    "off": ["training.eval_every=0", "training.eval_before_train=false"],
    "in_line": ["training.eval_background=false"],
    "beside": [],
}


def eval_windows(table) -> list:
    """(start, end) wall times of the evaluations a run reported: the report's wall time back by
    the evaluation's own wall time (``Perf/evaluation_ms``)."""
    from raylab.metrics import schema as S

    if S.PERF_EVALUATION_MS not in table.tags:
        return []
    out = []
    for step, ms in table.column(S.PERF_EVALUATION_MS):
        end = table.wall_time.get(step)
        if end is not None and step > 0:  # the initial evaluation ran before any iteration
            out.append((end - ms / 1000.0, end))
    return out


def fps_during(table, windows) -> dict:
    """Mean ``Perf/total_fps`` of the iterations that ended inside an evaluation's window
    against the others (both after the first ``WARMUP_S`` seconds)."""
    from raylab.metrics import schema as S

    start = min(table.wall_time.values())
    during, other = [], []
    for step, fps in table.column(S.PERF_TOTAL_FPS):
        t = table.wall_time.get(step)
        if t is None or t - start < WARMUP_S:
            continue
        (during if any(a <= t <= b for a, b in windows) else other).append(fps)

    def mean(xs):
        return round(sum(xs) / len(xs), 1) if xs else None

    drop = None
    if during and other:
        drop = round(1.0 - mean(during) / mean(other), 4)
    return {"fps_during_eval": mean(during), "fps_otherwise": mean(other), "fps_drop": drop}


def in_run_cost(table, wall_s: float) -> dict:
    """What evaluating cost the run, measured inside it: the initial evaluation's whole time
    (nothing trains before it) plus, for every later evaluation, its window's length times the
    Steps/s drop during the windows; as a share of the run's wall time. Host speed drifts by
    more than an evaluation's cost between runs minutes apart, so this is compared across
    settings, not the runs' env step totals."""
    from raylab.metrics import schema as S

    windows = eval_windows(table)
    fps = fps_during(table, windows)
    evals = dict(table.column(S.PERF_EVALUATION_MS)) if S.PERF_EVALUATION_MS in table.tags else {}
    initial_s = evals.get(0, 0.0) / 1000.0
    window_s = sum(b - a for a, b in windows)
    lost_s = initial_s + (fps["fps_drop"] or 0.0) * window_s
    return {
        **fps,
        "initial_eval_s": round(initial_s, 2),
        "eval_window_s": round(window_s, 1),
        "lost_s": round(lost_s, 2),
        "in_run_cost": round(lost_s / wall_s, 4) if wall_s > 0 else None,
    }


def analyse(run: Path, name: str) -> dict:
    from raylab.metrics.extract import extract

    summary = json.loads((run / "run_summary.json").read_text())
    table = extract(run)
    wall = float(summary["time_total_s"])
    return {
        "run": str(run),
        "env_steps": max(table.steps),
        "wall_s": round(wall, 1),
        **({} if name == "off" else share(run)),
        **({} if name == "off" else in_run_cost(table, wall)),
    }


def compare(args, overrides) -> dict:
    import subprocess

    rounds = []
    for r in range(args.rounds):
        row = {}
        for name, extra in VARIANTS.items():
            run = args.keep / f"r{r}_{name}"
            if not args.analyse_only:
                cmd = [
                    str(Path(sys.executable).with_name("raylab")),
                    "train",
                    f"training.log_dir={run}",
                    "training.terminal=plain",
                    "resources.dashboard=false",
                    *extra,
                    *overrides,
                ]
                print(
                    f"round {r + 1}/{args.rounds}, evaluation {name}: {' '.join(cmd)}", flush=True
                )
                with open(f"{run}.log", "w") as log:
                    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    raise SystemExit(
                        f"eval_share: the run failed (exit {rc}); its output: {run}.log"
                    )
            row[name] = analyse(run, name)
            print(f"  {row[name]['env_steps']:,} env steps in {row[name]['wall_s']} s", flush=True)
        for name in ("in_line", "beside"):  # across runs: host drift included
            row[name]["cost_vs_off"] = round(
                1.0 - row[name]["env_steps"] / row["off"]["env_steps"], 4
            )
        rounds.append(row)
    return {"rounds": rounds}


def main(argv=None) -> int:
    from raylab.bench.common import command_line, machine_info

    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    p.add_argument("--compare", action="store_true", help="train off / in line / beside")
    p.add_argument("--rounds", type=int, default=2, help="--compare: rounds of the three runs")
    p.add_argument("--keep", type=Path, default=Path("runs/eval_share"), help="--compare: runs")
    p.add_argument(
        "--analyse-only", action="store_true", help="--compare: read the kept runs, train none"
    )
    args = p.parse_args(argv)
    if args.compare:
        args.keep.mkdir(parents=True, exist_ok=True)
        command = command_line("python benchmarks/eval_share.py", sys.argv[1:])
        print(command, flush=True)
        before = machine_info()
        out = compare(args, overrides)
        for i, row in enumerate(out["rounds"]):
            for name in ("in_line", "beside"):
                r = row[name]
                print(
                    f"round {i + 1}, {name}: in-run cost {100 * r['in_run_cost']:.1f}% of the "
                    f"wall time (initial evaluation {r['initial_eval_s']} s, Steps/s during the "
                    f"later ones {r['fps_during_eval']} vs {r['fps_otherwise']} otherwise over "
                    f"{r['eval_window_s']} s); env steps {r['env_steps']:,} vs "
                    f"{row['off']['env_steps']:,} without evaluation "
                    f"({100 * r['cost_vs_off']:+.1f}%)"
                )
        if args.out:
            out = {"command": command, "machine": before, "machine_after": machine_info(), **out}
            args.out.write_text(json.dumps(out, indent=1) + "\n")
            print(f"saved {args.out}")
        return 0
    if not args.runs:
        p.error("give run directories, or --compare")
    missing = [str(r) for r in args.runs if not (r / "run_summary.json").exists()]
    if missing:
        print(
            f"eval_share: not a run directory (no run_summary.json): {missing[0]}", file=sys.stderr
        )
        return 2
    rows = [share(r) for r in args.runs]
    command = command_line("python benchmarks/eval_share.py", sys.argv[1:])
    print(command)
    for r in rows:
        print(
            f"{Path(r['run']).name}: {r['evaluations']} evaluations of {r['eval_episodes']} "
            f"episodes every {r['eval_every']} iterations, {r['eval_s']:.1f} s of "
            f"{r['wall_s']:.0f} s = {100 * r['share']:.1f}% (one every {r['interval_s']} s)"
        )
    if args.out:
        out = {"command": command, "machine": machine_info(), "runs": rows}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
