"""How far can a controller that knows the simulator get on microduck_balance?

    python benchmarks/push_oracle.py [--episodes 20] [--seed 1000] [--samples 64]
        [--horizon 30] [--threads 2] [--out benchmarks/results/push_oracle.json]

A ceiling for the learning targets, not a policy: predictive sampling (model-predictive control
by random search) with the task's own MuJoCo model and the true state. Before every control step
it copies the env's full physics state, rolls out ``--samples`` action sequences of
``--horizon`` control steps (the best plan of the step before, shifted by one; holding the stand
pose; and the shifted plan plus Gaussian noise on ``--knots`` knots, linear between them) with
``mujoco.rollout`` on ``--threads`` threads, scores each by the task's reward terms (upright,
height, action rate, joint velocity; weights of reward v2) minus ``--fall-penalty`` for every
step the duck would be down, and applies the first action of the best. Its rollouts contain no
pushes: like a policy, it sees a push only once it has happened (one control step later).

The episodes are the evaluation's: the task's reference env with its defaults, seeds
``--seed`` .. ``--seed + episodes - 1``, run through ``run_policy_episodes`` (the code of
``raylab eval``), so return, survival and the push table compare with the learning table in
benchmarks/README.md; holding the pose runs on the same seeds in the same call. Saves JSON with
the machine's load and cores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
from mujoco import rollout

import raylab.envs  # noqa: F401  (registers the tasks)
from raylab.algorithms.evaluation import run_policy_episodes
from raylab.bench.common import machine_info
from raylab.envs.robots.microduck import N_SUBSTEPS, NUM_ACTIONS, STAND_HEIGHT, is_fallen

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = {
    "action_rate": -0.05,
    "joint_vel": -4.2e-2,
}  # reward v2 (envs/tasks/microduck_balance.py)


class Oracle:
    """Predictive sampling on the single env ``env`` (its unwrapped reference env)."""

    def __init__(self, env, args, rng: np.random.Generator):
        self.env, self.a, self.rng = env, args, rng
        m = env.model
        self.datas = [mujoco.MjData(m) for _ in range(args.threads)]
        self.spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        self.state = np.empty(mujoco.mj_stateSize(m, self.spec))
        # FULLPHYSICS state: time, qpos, qvel, ...; the trunk's free joint gives its position
        # and orientation (rollout's sensordata is taken before each step's integration, the
        # state after it, which is what the env's info reads)
        root = m.jnt_qposadr[m.body_jntadr[env.robot.trunk_id]]
        self.pos, self.quat = 1 + root, 1 + root + 3
        self.qvel0 = 1 + m.nq
        self.plan = np.zeros((args.horizon, NUM_ACTIONS))
        t = np.arange(args.horizon)
        knots = np.linspace(0, args.horizon - 1, args.knots)
        # (horizon, knots): linear interpolation weights from knot values to every step
        self.interp = np.stack(
            [np.interp(t, knots, np.eye(args.knots)[k]) for k in range(args.knots)], axis=1
        )
        self.calls = self.episodes = 0

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        env, a, robot = self.env, self.a, self.env.robot
        if env.t == 0:
            self.plan[:] = 0.0
            self.episodes += 1
            print(f"  oracle: episode {self.episodes} of {a.episodes}", flush=True)
        n, h = a.samples, a.horizon
        shifted = np.concatenate([self.plan[1:], self.plan[-1:]])
        noise = a.sigma * self.rng.standard_normal((n - 2, a.knots, NUM_ACTIONS))
        cands = np.concatenate(
            [shifted[None], np.zeros((1, h, NUM_ACTIONS)), shifted[None] + self.interp @ noise]
        )
        cands = np.clip(cands, -1.0, 1.0)
        # servo targets, held for the N_SUBSTEPS physics steps of each control step
        ctrl = np.broadcast_to(env.data.ctrl, (n, h, env.model.nu)).copy()
        ctrl[:, :, robot.act_ids] = np.clip(
            robot.stand + env.opts.action_scale * cands, robot.lower, robot.upper
        )
        ctrl = np.repeat(ctrl, N_SUBSTEPS, axis=1)
        mujoco.mj_getState(env.model, env.data, self.state, self.spec)
        state, _ = rollout.rollout(
            env.model, self.datas, self.state, ctrl, initial_warmstart=env.data.qacc_warmstart
        )
        ends = state[:, np.arange(h) * N_SUBSTEPS + N_SUBSTEPS - 1]  # after each control step
        q = ends[..., self.quat : self.quat + 4]
        q = q / np.linalg.norm(q, axis=-1, keepdims=True)
        up = 1.0 - 2.0 * (q[..., 1] ** 2 + q[..., 2] ** 2)
        z = ends[..., self.pos + 2]
        qd = ends[..., self.qvel0 + robot.dof_adr]
        prev = np.concatenate(
            [np.broadcast_to(env.last_action, (n, 1, NUM_ACTIONS)), cands[:, :-1]], 1
        )
        reward = (
            np.maximum(up, 0.0)
            + np.clip(z / STAND_HEIGHT, 0.0, 1.0)
            + WEIGHTS["action_rate"] * np.mean((cands - prev) ** 2, axis=-1)
            + WEIGHTS["joint_vel"] * np.mean(qd**2, axis=-1)
            - a.fall_penalty * is_fallen(z, up)
        )
        best = int(np.argmax(reward.sum(axis=1)))
        self.plan = cands[best]
        # what the model predicts for the first step of the chosen plan (tests compare it)
        self.predicted = {"trunk_height": float(z[best, 0]), "upright_cos": float(up[best, 0])}
        self.calls += 1
        return self.plan[0][None].astype(np.float32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--horizon", type=int, default=30, help="control steps per rollout")
    p.add_argument("--knots", type=int, default=5)
    p.add_argument("--sigma", type=float, default=0.3, help="noise on the knots (action units)")
    p.add_argument("--fall-penalty", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "push_oracle.json"))
    args = p.parse_args(argv)
    for name in ("episodes", "samples", "horizon", "knots", "threads"):
        if getattr(args, name) < (3 if name in ("samples", "knots") else 1):
            sys.exit(f"push_oracle: --{name.replace('_', '-')} {getattr(args, name)} is too small")
    command = "python benchmarks/push_oracle.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    print("==", command, flush=True)
    before = machine_info()

    env = gym.make_vec("raylab/MicroduckBalance-v0", num_envs=1, vectorization_mode="sync")
    t0 = time.time()
    hold = run_policy_episodes(
        lambda o: np.zeros((1, NUM_ACTIONS), np.float32), env, args.episodes, args.seed
    )
    print(
        f"hold pose: return {hold['mean_return']:.1f}  survival {hold['survival']:.3f}", flush=True
    )
    oracle = Oracle(env.envs[0].unwrapped, args, np.random.default_rng(0))
    t1 = time.time()
    out = run_policy_episodes(oracle, env, args.episodes, args.seed)
    wall = time.time() - t1
    print(
        f"oracle:    return {out['mean_return']:.1f}  survival {out['survival']:.3f}  "
        f"({wall:.0f} s, {wall / max(oracle.calls, 1) * 1e3:.0f} ms per control step)"
    )
    for name, s in (("hold pose", hold), ("oracle", out)):
        print(
            f"  {name:9s} felled by pushes of (m/s): "
            + ", ".join(
                f"{r['speed'][0]:.2f}-{r['speed'][1]:.2f} {r['felled']}/{r['pushes']}"
                for r in s["push_table"]
            )
        )
    result = {
        "command": command,
        "args": vars(args),
        "machine_before": before,
        "machine_after": machine_info(),
        "wall_s": round(time.time() - t0, 1),
        "oracle_s_per_control_step": wall / max(oracle.calls, 1),
        "hold_pose": {
            k: v for k, v in hold.items() if k not in ("returns", "lengths", "survivals")
        },
        "oracle": {k: v for k, v in out.items() if k not in ("lengths", "survivals")},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"== wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
