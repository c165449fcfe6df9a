#!/usr/bin/env bash
# Learning per env step is the same on raylab's rollout loop and on RLlib's EnvRunner loop:
# APPO on microduck_balance, the same seeds and the same budget in env steps on both paths
# (training.fast_sampler=true / false, both on the batched env), each run evaluated by
# `raylab eval` (deterministic actions, 100 episodes, seeds 0-99).
#
#   benchmarks/learning_equivalence.sh [STEPS] [SEEDS...]      # default 500000 steps, seeds 0 1 2
#
# Writes benchmarks/results/learning_equivalence.json (per run: path, seed, env steps, wall
# time, evaluation return and survival; per path: mean and sd over seeds).
set -euo pipefail
cd "$(dirname "$0")/.."
RAYLAB=${RAYLAB:-raylab}
STEPS=${1:-500000}; shift || true
SEEDS=${*:-0 1 2}
OUT=runs/learning_equivalence
mkdir -p "$OUT"
echo "== $(date -Iseconds)  $(uptime)"
for seed in $SEEDS; do
  for fast in true false; do
    run="$OUT/appo-fast_$fast-seed_$seed"
    rm -rf "$run"
    echo "== $RAYLAB train --algo appo --task microduck_balance training.seed=$seed training.fast_sampler=$fast training.total_steps=$STEPS training.time_budget_s=null"
    $RAYLAB train --algo appo --task microduck_balance "training.log_dir=$run" \
      "training.seed=$seed" "training.fast_sampler=$fast" "training.total_steps=$STEPS" \
      training.time_budget_s=null resources.dashboard=false training.terminal=plain \
      > "$run.log" 2>&1
    tail -2 "$run.log"
    $RAYLAB eval "$run" --episodes 100 --seed 0 > "$run.eval.log" 2>&1
    tail -1 "$run.eval.log"
  done
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
out, runs = Path(sys.argv[1]), []
for d in sorted(p for p in out.iterdir() if p.is_dir()):
    summary = json.loads((d / "run_summary.json").read_text())
    ev = json.loads((d / "eval.json").read_text())
    _, fast, seed = d.name.split("-")
    runs.append({"run": d.name, "fast_sampler": fast == "fast_true", "seed": int(seed.split("_")[1]),
                 "env_steps": summary["env_steps"], "wall_s": summary["time_total_s"],
                 "eval_return": ev["mean_return"], "eval_survival": ev["survival"]})
paths = {}
for fast in (True, False):
    r = [x for x in runs if x["fast_sampler"] == fast]
    ret = np.array([x["eval_return"] for x in r])
    paths["fast" if fast else "rllib"] = {
        "seeds": [x["seed"] for x in r], "eval_return_mean": float(ret.mean()),
        "eval_return_sd": float(ret.std(ddof=1)) if len(ret) > 1 else 0.0,
        "wall_s_mean": float(np.mean([x["wall_s"] for x in r]))}
res = {"command": "benchmarks/learning_equivalence.sh " + " ".join(sys.argv[2:]), "runs": runs, "paths": paths}
Path("benchmarks/results/learning_equivalence.json").write_text(json.dumps(res, indent=2))
for k, v in paths.items():
    print(f"{k:6} eval return {v['eval_return_mean']:.1f} +/- {v['eval_return_sd']:.1f} over seeds {v['seeds']}, wall {v['wall_s_mean']:.0f} s")
PY
echo "== done $(date -Iseconds)  $(uptime)"
