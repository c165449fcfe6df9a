#!/usr/bin/env bash
# Reproduce every committed benchmark result (benchmarks/results/*.json) and its plot
# (benchmarks/plots/*.png). About 50 minutes on a 2-core machine; longer where the machine has
# more cores (the thread sweep and the worker comparison then add rows for 4 and 8).
#
#   benchmarks/run_all.sh            # everything
#   benchmarks/run_all.sh env        # only the env benchmarks (sweeps, sustained, compare)
#   benchmarks/run_all.sh train      # only the training benchmarks
#   benchmarks/run_all.sh learn      # SAC sample efficiency against stock RLlib SAC (not in all)
#
# Run it on a quiet machine: every result records the load average before and after and the
# busy processes it saw, and a number taken under load says so in its own file (verdict,
# warnings). Nothing here changes a training default.
set -euo pipefail

cd "$(dirname "$0")/.."
RAYLAB=${RAYLAB:-raylab}
RES=benchmarks/results
PLOTS=benchmarks/plots
mkdir -p "$RES" "$PLOTS"
what=${1:-all}

# Thread / worker counts: 1, 2, 4, 8 up to this machine's cores (the backend's own limit).
cores=$(python -c "import os; print(len(os.sched_getaffinity(0)))")
COUNTS=""
for t in 1 2 4 8; do
    if [ "$t" -le "$cores" ]; then COUNTS="$COUNTS $t"; fi
done
MAXT=${COUNTS##* }

echo "== $(date -Iseconds)  $(uptime)"
echo "== cores $cores, thread counts:$COUNTS"

if [ "$what" = all ] || [ "$what" = env ]; then
    # 1. The batched env over the thread sweep, each row paired with a bare-physics window at
    #    the same threads (env/bare from adjacent windows); one-thread references between rows.
    $RAYLAB bench env --threads $COUNTS --num-envs 64 --seconds 20 --ref-seconds 10 \
        --with-bare --out "$RES/env_sweep.json"
    # 2. Physics alone (N x 10 mj_step on the same threads), its own sweep and references.
    $RAYLAB bench env --mode bare --threads $COUNTS --num-envs 64 --seconds 20 --ref-seconds 10 \
        --out "$RES/env_sweep_bare.json"
    # 3. Sustained: all threads, 18 windows of 10 s back to back.
    $RAYLAB bench env --sustained "$MAXT" --windows 18 --num-envs 64 --seconds 10 \
        --ref-seconds 10 --out "$RES/env_sustained.json"
    # 4. Batched env vs Gymnasium AsyncVectorEnv / SyncVectorEnv of the reference env, one env
    #    per worker (Gymnasium's own model: one process per env) ...
    $RAYLAB bench compare --workers $COUNTS --envs-per-worker 1 --seconds 10 --rounds 3 \
        --out "$RES/compare_1env.json"
    # 5. ... and 16 envs per worker (the batch sizes training uses).
    $RAYLAB bench compare --workers $COUNTS --envs-per-worker 16 --seconds 10 --rounds 3 \
        --out "$RES/compare_16env.json"

    $RAYLAB bench plot "$RES/env_sweep.json" --bare "$RES/env_sweep_bare.json" \
        --out "$PLOTS/env_sweep.png"
    $RAYLAB bench plot "$RES/env_sweep_bare.json" --out "$PLOTS/env_sweep_bare.png"
    $RAYLAB bench plot "$RES/env_sustained.json" --out "$PLOTS/env_sustained.png"
    $RAYLAB bench plot "$RES/compare_1env.json" --out "$PLOTS/compare_1env.png"
    $RAYLAB bench plot "$RES/compare_16env.json" --out "$PLOTS/compare_16env.png"
fi

if [ "$what" = all ] || [ "$what" = train ]; then
    # 6. End to end, default training configs (what `raylab train` runs: raylab's rollout loop
    #    on the batched env, env.num_threads=auto) against stock RLlib (its own EnvRunner loop
    #    on Gymnasium's SyncVectorEnv of the reference env), alternating runs.
    $RAYLAB bench train --algo appo --seconds 45 --warmup 15 --rounds 2 --out "$RES/train_appo.json"
    $RAYLAB bench train --algo ppo --seconds 45 --warmup 15 --rounds 2 --out "$RES/train_ppo.json"
    # 7. SAC: also stock RLlib SAC (same hyperparameters, one update per env step) and the
    #    plain-torch update limit.
    $RAYLAB bench train --algo sac --seconds 45 --warmup 15 --rounds 1 --out "$RES/train_sac.json"
    # 8. The rollout loop alone: raylab's EnvRunner against RLlib's EnvRunner loop on the same
    #    batched env, on the batched env with random actions (no policy: the ceiling), and end to
    #    end with the loop switched off (training.fast_sampler=false) on the batched env.
    $RAYLAB bench train --algo appo --sampler --seconds 10 --rounds 3 --out "$RES/sampler_appo.json"
    $RAYLAB bench train --algo ppo --sampler --seconds 10 --rounds 3 --out "$RES/sampler_ppo.json"
    $RAYLAB bench train --algo appo --sides batched --vary training.fast_sampler=true,false \
        --seconds 45 --warmup 15 --rounds 1 --out "$RES/train_appo_fast_sampler.json"
    # 9. What the live panel's short iterations cost: APPO at training.iteration_s=1 (the
    #    default) against 5, batched env, alternating runs.
    $RAYLAB bench train --algo appo --sides batched --vary training.iteration_s=1,5 --seconds 45 \
        --warmup 15 --rounds 2 --out "$RES/train_appo_iteration_s.json"

    # 10. End to end against bare physics on all cores (every run above also has its physics
    #     windows, --physics-seconds 5): APPO on one EnvRunner x 32 envs (the default) and on
    #     two x 16 (the same envs, two processes whose serial parts overlap), PPO with its
    #     update on one torch thread or on both cores (its default), SAC at its default replay
    #     ratio and at 0.25 with 32 envs on one or two learner threads.
    $RAYLAB bench train --algo appo --sides batched --rounds 2 --seconds 30 --warmup 20 \
        --vary resources.num_env_runners=1,2 --vary env.num_envs=32,16 \
        --out "$RES/train_appo_physics.json"
    $RAYLAB bench train --algo ppo --sides batched --rounds 2 --seconds 30 --warmup 20 \
        --vary algo.learner_threads=1,2 --out "$RES/train_ppo_physics.json"
    $RAYLAB bench train --algo sac --sides batched --rounds 1 --seconds 40 --warmup 30 \
        --vary resources.num_cpus_per_learner=1,2 --out "$RES/train_sac_physics.json" \
        env.num_envs=32 algo.updates_per_step=0.25
    $RAYLAB bench train --algo sac --sides batched --no-stock-sac --rounds 1 --seconds 40 \
        --warmup 30 --out "$RES/train_sac_default_physics.json"

    for a in appo sac ppo appo_fast_sampler appo_iteration_s; do
        $RAYLAB bench plot "$RES/train_$a.json" --out "$PLOTS/train_$a.png"
    done
fi

if [ "$what" = learn ]; then
    # 10. Not part of `all` (stock RLlib SAC needs 10-15 minutes here): env steps until SAC's
    #    mean return on Pendulum reaches -250, raylab SAC against stock RLlib SAC, same
    #    hyperparameters, one env per runner.
    ${PYTHON:-python} benchmarks/sac_sample_efficiency.py --task Pendulum-v1 --threshold -250 \
        --max-steps 12000 --seeds 0 --out "$RES/sac_pendulum_sample_efficiency.json" env.num_envs=1
fi

echo "== done $(date -Iseconds)  $(uptime)"
