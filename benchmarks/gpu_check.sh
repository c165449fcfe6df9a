#!/usr/bin/env bash
# The learners' CUDA path, proved on a machine with a GPU (about 4.5 minutes).
#
#   benchmarks/gpu_check.sh            # PPO, APPO, SAC on microduck_balance
#
# For each algorithm: 45 s of training with resources.num_gpus_per_learner=1, then 30 s of the
# same run on the CPU. From each run's runtime manifest it asserts where every Learner ran (cuda
# for the GPU runs, cpu for the CPU runs) and prints learner updates/s and env steps/s side by
# side (Perf/learner_updates_per_s and Perf/total_fps, medians over the run's iterations).
# Exit status 1 if a GPU run's Learner was not on CUDA. Results: runs/gpu_check/summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."
RAYLAB=${RAYLAB:-raylab}
OUT=runs/gpu_check
rm -rf "$OUT"; mkdir -p "$OUT"
echo "== $(date -Iseconds)  $(uptime)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for algo in ppo appo sac; do
  for dev in gpu cpu; do
    if [ "$dev" = gpu ]; then gpus=1; secs=45; else gpus=0; secs=30; fi
    echo "== $algo on $dev: $RAYLAB train --algo $algo --task microduck_balance resources.num_gpus_per_learner=$gpus training.time_budget_s=$secs"
    $RAYLAB train --algo "$algo" --task microduck_balance "training.log_dir=$OUT/$algo-$dev" \
      "resources.num_gpus_per_learner=$gpus" "training.time_budget_s=$secs" \
      resources.dashboard=false training.terminal=plain training.checkpoint_every=0 \
      > "$OUT/$algo-$dev.log" 2>&1 || { tail -20 "$OUT/$algo-$dev.log"; exit 1; }
  done
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from raylab.metrics.extract import extract
from raylab.metrics import schema as S
out, rows, ok = Path(sys.argv[1]), {}, True
for algo in ("ppo", "appo", "sac"):
    for dev in ("gpu", "cpu"):
        run = out / f"{algo}-{dev}"
        summary = json.loads((run / "run_summary.json").read_text())
        devices = sorted({str(l["device"]) for l in summary["runtime_manifest"]["learners"]})
        want = "cuda" if dev == "gpu" else "cpu"
        placed = all(d.startswith(want) for d in devices)
        ok &= placed or dev == "cpu"
        data = extract(run)
        med = lambda tag: float(np.median([v for _, v in data.column(tag) if v is not None] or [float("nan")]))
        rows[f"{algo}-{dev}"] = {"learner_devices": devices, "on_expected_device": placed,
                                 "learner_updates_per_s": med(S.PERF_LEARNER_UPDATES_PER_S),
                                 "env_steps_per_s": med(S.PERF_TOTAL_FPS)}
print(f"{'run':10} {'learner devices':22} {'updates/s':>10} {'env steps/s':>12}")
for k, r in rows.items():
    print(f"{k:10} {','.join(r['learner_devices']):22} {r['learner_updates_per_s']:10.1f} {r['env_steps_per_s']:12,.0f}"
          + ("" if r["on_expected_device"] else "   <- NOT on the expected device"))
(out / "summary.json").write_text(json.dumps(rows, indent=2))
print(f"wrote {out / 'summary.json'}")
sys.exit(0 if ok else 1)
PY
