"""Evaluation's share of training runs' wall time, read from their event files.

    python benchmarks/eval_share.py RUN_DIR [RUN_DIR ...] [--out benchmarks/eval_share.json]

Per run: the evaluations (``Perf/evaluation_ms``, one per evaluation, the initial one included),
their total, the run's wall time (``time_total_s`` of ``run_summary.json``), the share, the
mean interval between evaluations and the ``training.eval_every`` the run used. Saved as JSON
with the command and the machine it was read on (the runs' own machines are in their
manifests).
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


def main(argv=None) -> int:
    from raylab.bench.common import command_line, machine_info

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = p.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "run_summary.json").exists()]
    if missing:
        print(
            f"eval_share: not a run directory (no run_summary.json): {missing[0]}", file=sys.stderr
        )
        return 2
    rows = [share(r) for r in args.runs]
    command = command_line("python benchmarks/eval_share.py", argv or sys.argv[1:])
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
