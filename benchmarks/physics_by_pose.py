"""Bare Microduck physics with the duck standing against the duck fallen, alternating windows.

``raylab bench train --physics-seconds`` divides training's env-steps/s by bare physics whose
servo targets come from uniform random actions, under which the duck falls and lies on the
ground. A trained policy keeps it standing, and MuJoCo's cost per step depends on the contacts
it solves. This times the same bare step (``BatchedMujoco.bare_step``: N envs x ``nsubsteps``
``mj_step``, servo targets set first) from two states, in alternating windows (A B, B A, ...):

- ``random``: 200 env steps of uniform random actions, then their last 50 servo-target rows
  cycled (what the benchmark's windows do);
- ``hold``: 200 env steps of the zero action (the stand pose's servo targets), then those.

Both envs run the task with ``num_pushes=0`` so that the held duck stays up, and every window
starts from the state reached after those 200 steps (``mj_setState``; held open loop for
thousands of steps, the duck drifts and falls even without pushes). Saves the medians, the
contacts per env and the share of fallen envs at the end of each window, and the machine:

    python benchmarks/physics_by_pose.py --num-envs 32 --threads 1 --rounds 4 --seconds 3 \\
        --out benchmarks/results/physics_by_pose.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from typing import Any, Dict, List

import gymnasium as gym
import mujoco
import numpy as np

from raylab.bench import common as C

TASK_ID = "raylab/MicroduckBalance-v0"
FALLEN_HEIGHT = 0.08  # trunk height (m) below which an env counts as fallen here (stands ~0.11)


def make(pose: str, num_envs: int, threads: int, seed: int):
    """The task's batched env settled in ``pose`` and the servo-target rows its window cycles."""
    import raylab.envs  # noqa: F401  (registers the tasks)

    env = gym.make_vec(
        TASK_ID,
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        num_threads=threads,
        num_pushes=0,
    )
    env.reset(seed=seed)
    base = env.unwrapped
    rng = np.random.default_rng(seed)
    shape = (num_envs, base.single_action_space.shape[0])
    rows: List[np.ndarray] = []
    for t in range(200):
        a = np.zeros(shape, np.float32) if pose == "hold" else rng.uniform(-1, 1, shape)
        env.step(a.astype(np.float32))
        if t >= 150:
            rows.append(np.array(base.ctrl, copy=True))
    sim = base.sim
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    size = mujoco.mj_stateSize(sim.models[0], spec)
    saved = []
    for m, d in zip(sim.models, sim.datas):
        buf = np.empty(size)
        mujoco.mj_getState(m, d, buf, spec)
        saved.append(buf)
    return env, sim, rows, saved


def restore(sim, saved) -> None:
    """Every env back to the state its window starts from."""
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    for m, d, buf in zip(sim.models, sim.datas, saved):
        mujoco.mj_setState(m, d, buf, spec)
        mujoco.mj_forward(m, d)


def state(sim) -> Dict[str, float]:
    return {
        "contacts_per_env": float(np.mean([d.ncon for d in sim.datas])),
        "fallen_share": float(np.mean([d.qpos[2] < FALLEN_HEIGHT for d in sim.datas])),
    }


def window(sim, rows, num_envs: int, seconds: float) -> float:
    i, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sim.bare_step(rows[i % len(rows)])
        i += 1
    return i * num_envs / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=C.positive(int, "--num-envs"), default=32)
    p.add_argument("--threads", type=C.positive(int, "--threads"), default=1)
    p.add_argument("--rounds", type=C.positive(int, "--rounds"), default=4)
    p.add_argument("--seconds", type=C.positive(float, "--seconds"), default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/physics_by_pose.json")
    args = p.parse_args(argv)
    command = C.command_line(
        "python benchmarks/physics_by_pose.py", sys.argv[1:] if argv is None else argv
    )
    print(command)
    check = C.machine_check(threads_needed=args.threads)
    C.print_check(check)
    sims = {pose: make(pose, args.num_envs, args.threads, args.seed) for pose in ("random", "hold")}
    rates: Dict[str, list] = {pose: [] for pose in sims}
    states: Dict[str, list] = {pose: [] for pose in sims}
    for _, pose in C.round_order(list(sims), args.rounds):
        _, sim, rows, saved = sims[pose]
        restore(sim, saved)
        rate = window(sim, rows, args.num_envs, args.seconds)
        rates[pose].append(round(rate, 1))
        states[pose].append(state(sim))
        print(f"  {pose:<6} {rate:,.0f} env-steps/s  {states[pose][-1]}", flush=True)
    for env, *_ in sims.values():
        env.close()
    med = {pose: statistics.median(v) for pose, v in rates.items()}
    result: Dict[str, Any] = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "params": vars(args),
        "machine": C.machine_info(),
        "machine_check": check,
        "env_steps_per_s": rates,
        "states": states,
        "median": med,
        "hold_over_random": med["hold"] / med["random"],
        "loadavg_after": C.machine_info()["loadavg"],
    }
    print(
        f"hold {med['hold']:,.0f} / random {med['random']:,.0f} env-steps/s = "
        f"{result['hold_over_random']:.3f}"
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
