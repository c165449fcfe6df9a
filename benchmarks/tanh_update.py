"""APPO's update with torch's tanh against tanh by way of sigmoid (FastTanh).

raylab's Learners and EnvRunners swap every ``torch.nn.Tanh`` of their networks for
``raylab.algorithms.activations.FastTanh`` (``2 sigmoid(2x) - 1``, the same function). This
builds the real Learner of ``microduck_balance`` in this process (no Ray, one torch thread),
makes one train batch of random episode chunks of the task's shapes through its learner
connector, and times ``Learner.update`` on it in alternating windows (A B, B A, ...) with the
networks' activations torch's tanh and FastTanh; per case the medians of updates per CPU second
of this thread:

    python benchmarks/tanh_update.py --rounds 3 --seconds 6 \
        --out benchmarks/results/tanh_update.json

Cases: APPO's 2,048-row batch with 256-256 networks (the defaults) and 128-128. The JSON
holds the rates per window, the machine (cores, load before and after) and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Dict

from raylab.bench import common as C

# name: (algo, hidden, env steps in the batch)
CASES = {
    "appo_256x256": ("appo", [256, 256], 2048),
    "appo_128x128": ("appo", [128, 128], 2048),
}
FRAGMENT = 32  # steps per episode chunk


def _swap(module, to_fast: bool) -> None:
    import torch

    from raylab.algorithms.activations import FastTanh

    for name, child in module.named_children():
        if to_fast and type(child) is torch.nn.Tanh:
            setattr(module, name, FastTanh())
        elif not to_fast and isinstance(child, FastTanh):
            setattr(module, name, torch.nn.Tanh())
        else:
            _swap(child, to_fast)


def _learner_and_batch(algo: str, hidden, rows: int):
    import gymnasium as gym
    import numpy as np
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    import raylab.envs  # noqa: F401
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    cfg = compose(algo, "microduck_balance", "mujoco", [f"algo.hidden={hidden}"])
    env = gym.make(cfg.env.gym_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    spaces = {"__env__": (obs_space, act_space), "default_policy": (obs_space, act_space)}
    learner = build_algorithm_config(cfg).build_learner(spaces=spaces)
    learner.build()
    rng = np.random.default_rng(0)
    d, a = obs_space.shape[0], act_space.shape[0]
    chunks = [
        SingleAgentEpisode(
            id_=uuid.uuid4().hex,
            observations=rng.normal(size=(FRAGMENT + 1, d)).astype(np.float32),
            infos=[{} for _ in range(FRAGMENT + 1)],
            observation_space=obs_space,
            actions=rng.uniform(-1, 1, (FRAGMENT, a)).astype(np.float32),
            action_space=act_space,
            rewards=rng.uniform(0, 2, FRAGMENT).astype(np.float32),
            extra_model_outputs={
                Columns.ACTION_LOGP: rng.normal(-10, 1, FRAGMENT).astype(np.float32)
            },
            len_lookback_buffer=0,
        )
        for _ in range(rows // FRAGMENT)
    ]
    batch = learner._make_batch_if_necessary(training_data=TrainingData(episodes=chunks))
    return learner, batch


def _window(learner, batch, seconds: float) -> Dict[str, float]:
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.training_data import TrainingData

    def step():
        Learner.update(
            learner,
            training_data=TrainingData(batch=batch),
            timesteps={"num_env_steps_sampled_lifetime": 1},
            _no_metrics_reduce=True,
        )

    step()  # warm
    n, c0, t0 = 0, time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    cpu = time.thread_time() - c0
    return {"updates": n, "cpu_s": cpu, "updates_per_cpu_s": n / cpu}


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=C.positive(int, "--rounds"), default=3)
    p.add_argument("--seconds", type=C.positive(float, "--seconds"), default=6.0)
    p.add_argument("--out", default="benchmarks/results/tanh_update.json")
    args = p.parse_args(argv)
    command = C.command_line(
        "python benchmarks/tanh_update.py", sys.argv[1:] if argv is None else argv
    )
    print(command)
    torch.set_num_threads(1)
    check = C.machine_check(threads_needed=1)
    C.print_check(check)
    result: Dict[str, Any] = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "params": {"cases": args.cases, "rounds": args.rounds, "seconds": args.seconds},
        "machine": C.machine_info(),
        "machine_check": check,
    }
    t0 = time.perf_counter()
    rows = []
    for name in args.cases:
        algo, hidden, steps = CASES[name]
        learner, batch = _learner_and_batch(algo, hidden, steps)
        module = learner.module["default_policy"]
        rates: Dict[str, list] = {"torch_tanh": [], "fast_tanh": []}
        for _, side in C.round_order(list(rates), args.rounds):
            _swap(module, to_fast=side == "fast_tanh")
            w = _window(learner, batch, args.seconds)
            rates[side].append(round(w["updates_per_cpu_s"], 3))
            print(f"  {name}: {side} {w['updates_per_cpu_s']:.2f} updates per CPU s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        rows.append(
            {
                "case": name,
                "algo": algo,
                "hidden": hidden,
                "env_steps_per_update": steps,
                "updates_per_cpu_s": med,
                "updates_per_cpu_s_all": rates,
                "fast_over_torch": round(med["fast_tanh"] / med["torch_tanh"], 3),
            }
        )
    result["rows"] = rows
    result["duration_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for r in rows:
        u = r["updates_per_cpu_s"]
        print(
            f"{r['case']:14s} torch tanh {u['torch_tanh']:7.2f}  FastTanh {u['fast_tanh']:7.2f} "
            f"updates per CPU s  {r['fast_over_torch']:.2f}x"
        )
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
