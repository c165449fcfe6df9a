"""One documented learning run: train within a wall-time budget, evaluate, plot, save JSON.

    python benchmarks/learning_run.py NAME --algo ALGO --task TASK --budget-min M [--seed S]
        [--target-headroom H] [--post-only] [-- KEY=VALUE ...]

1. ``raylab train`` with ``training.time_budget_s = 60 * M`` (and no step limit) into
   ``runs/learning/NAME`` (ignored by git; the log next to it);
2. ``raylab eval`` of the best evaluation's checkpoint and of the last one, 100 deterministic
   episodes with the baselines' protocol (seeds 1000-1099);
3. the task's hold-pose and random-action scores (and hold-pose without pushes on a task that
   pushes) by the same evaluation code (``raylab.evaluate.baseline_scores``, 100 episodes);
4. ``benchmarks/learning/NAME.json``: the command, the machine (cores, load before and after,
   what else was busy when it started), the run's steps and wall time, both evaluations, the
   baselines and the headroom taken (docs/envs.md; and the target, when given); and
   ``benchmarks/learning/NAME.png``, the curve (``raylab plot``).

A configuration that anneals the learning rate over ``training.total_steps`` (PPO's defaults
on a Gymnasium id) needs ``training.total_steps=N`` among the overrides: the budget, not the
step count, ends the run, and the schedule spans N env steps. (The policy std's schedule, PPO's
default on ``go2_joystick_flat``, ends with the budget by itself.)

``--post-only`` redoes steps 2-4 for a run that trained already. Several seeds of one config:
``raylab plot runs/learning/A runs/learning/B ...``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "runs" / "learning"
OUT = REPO / "benchmarks" / "learning"
RAYLAB = str(Path(sys.executable).with_name("raylab"))


def _eval(run: Path, checkpoint: str) -> dict:
    args = [RAYLAB, "eval", str(run), "--episodes", "100", "--seed", "1000"]
    if checkpoint != "last":
        args += ["--checkpoint", checkpoint]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads((run / "eval.json").read_text())
    for key in ("returns", "lengths", "survivals"):
        out.pop(key, None)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name")
    p.add_argument("--algo", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--budget-min", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target-headroom", type=float, default=None, help="target share of the headroom taken"
    )
    p.add_argument("--post-only", action="store_true", help="evaluate and write an existing run")
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    a.overrides = overrides

    sys.path.insert(0, str(REPO))
    from raylab.bench.common import busy_processes, machine_info

    # The run stops on its time budget, so training.total_steps is set out of reach below; a
    # linear learning rate, which spans training.total_steps only, would then never move. Such
    # a run names the steps it spans. (The log-std bound's schedule ends with the time budget
    # when that comes first: nothing to name.)
    from raylab.config import compose
    from raylab.errors import UserError

    try:
        cfg = compose(a.algo, a.task, overrides=a.overrides)
    except UserError as e:
        p.error(str(e))
    scheduled = getattr(cfg.algo, "lr_schedule", "constant") == "linear"
    if scheduled and not any(o.startswith("training.total_steps=") for o in a.overrides):
        p.error(
            f"{a.algo} on {a.task} anneals its learning rate over training.total_steps; pass "
            "training.total_steps=N (the env steps it spans, e.g. what the budget reaches) "
            "after --"
        )

    run = RUNS / a.name
    if run.exists() and not a.post_only:
        p.error(f"{run} exists; pick another NAME or remove it")
    if a.post_only and not run.exists():
        p.error(f"--post-only: no run {run}")
    RUNS.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    train = [
        RAYLAB,
        "train",
        "--algo",
        a.algo,
        "--task",
        a.task,
        f"training.log_dir={run}",
        f"training.seed={a.seed}",
        f"training.time_budget_s={60.0 * a.budget_min}",
        "training.total_steps=1000000000000",
        "training.terminal=plain",
        "resources.dashboard=false",
        *a.overrides,
    ]
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])
    print(f"== {command}\n== {' '.join(shlex.quote(x) for x in train)}", flush=True)
    before = {"machine": machine_info(), "busy": busy_processes()}
    t0 = time.time()
    rc, wall = 0, None
    if not a.post_only:
        with open(RUNS / f"{a.name}.log", "w") as log:
            rc = subprocess.run(train, stdout=log, stderr=subprocess.STDOUT).returncode
        wall = time.time() - t0
    summary = (
        json.loads((run / "run_summary.json").read_text())
        if (run / "run_summary.json").is_file()
        else {}
    )
    result = {
        "name": a.name,
        "command": command,
        "train_command": train[1:],
        "returncode": rc,
        "algo": a.algo,
        "task": a.task,
        "seed": a.seed,
        "budget_min": a.budget_min,
        "wall_s": round(wall, 1) if wall is not None else None,
        "time_total_s": summary.get("time_total_s"),
        "env_steps": summary.get("env_steps"),
        "training_iteration": summary.get("training_iteration"),
        "best_eval_during_training": summary.get("best_eval"),
        "initial_eval": summary.get("initial_eval"),
        "machine_before": before["machine"],
        "busy_at_start": before["busy"],
        "post_only": a.post_only,
    }
    result["eval_best"] = _eval(run, "best")
    result["eval_last"] = _eval(run, "last")
    from raylab.envs.tasks import TASKS

    if a.task in TASKS:
        from raylab.evaluate import baseline_scores, headroom
        from raylab.train import load_run_config

        cfg = load_run_config(run)
        base = baseline_scores(cfg, episodes=100, seed=1000)
        result["baselines"] = base
        # The policy a user would take: the best evaluation's checkpoint (chosen on the
        # in-training evaluations), else the last one.
        chosen = (
            result["eval_best"] if "mean_return" in result["eval_best"] else result["eval_last"]
        )
        taken = headroom(chosen.get("mean_return", float("nan")), base)
        if taken is not None:
            result["headroom"] = taken
            if a.target_headroom is not None:
                result["target_headroom"] = a.target_headroom
                result["target_met"] = bool(taken >= a.target_headroom)
    result["machine_after"] = machine_info()
    subprocess.run([RAYLAB, "plot", str(run), "--out", str(OUT / f"{a.name}.png")], check=False)
    path = OUT / f"{a.name}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"== wrote {path}", flush=True)
    for key in ("eval_best", "eval_last"):
        e = result[key]
        print(f"{key}: return {e.get('mean_return')}  survival {e.get('survival')}", flush=True)
    if "headroom" in result:
        print(f"headroom taken {result['headroom']:.3f}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
