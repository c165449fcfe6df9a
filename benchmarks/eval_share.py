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
(``training.eval_background=false``) and beside training (the default). The cost of an
evaluation setting is the env steps its run sampled short of the same round's run without
evaluation (``1 - steps / steps_off``, the share of the run's time that went to evaluating),
and the drop of ``Perf/total_fps`` on the iterations during which an evaluation ran (from the
report's wall time back by ``Perf/evaluation_ms``; the first 20 s of a run left out) against
the run's other iterations. Saved as JSON with the command, the machine and its load.
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


def compare(args, overrides) -> dict:
    import subprocess

    from raylab.metrics.extract import extract

    rounds = []
    for r in range(args.rounds):
        row = {}
        for name, extra in VARIANTS.items():
            run = args.keep / f"r{r}_{name}"
            cmd = [
                str(Path(sys.executable).with_name("raylab")),
                "train",
                f"training.log_dir={run}",
                "training.terminal=plain",
                "resources.dashboard=false",
                *extra,
                *overrides,
            ]
            print(f"round {r + 1}/{args.rounds}, evaluation {name}: {' '.join(cmd)}", flush=True)
            with open(f"{run}.log", "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                raise SystemExit(f"eval_share: the run failed (exit {rc}); its output: {run}.log")
            summary = json.loads((run / "run_summary.json").read_text())
            table = extract(run)
            steps = max(table.steps)
            row[name] = {
                "run": str(run),
                "env_steps": steps,
                "wall_s": round(float(summary["time_total_s"]), 1),
                **({} if name == "off" else share(run)),
                **fps_during(table, eval_windows(table)),
            }
            print(f"  {steps:,} env steps in {row[name]['wall_s']} s", flush=True)
        for name in ("in_line", "beside"):
            row[name]["cost"] = round(1.0 - row[name]["env_steps"] / row["off"]["env_steps"], 4)
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
                    f"round {i + 1}, {name}: cost {100 * r['cost']:.1f}% of the env steps "
                    f"({r['env_steps']:,} vs {row['off']['env_steps']:,}); Steps/s during "
                    f"evaluations {r['fps_during_eval']} vs {r['fps_otherwise']} otherwise"
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
