"""Go2-like quadruped joystick task on flat ground: ``raylab/Go2JoystickFlat-v0``.

The model is raylab's own MJCF (``assets/go2.xml``); the task is the table :data:`TASK` run by
:class:`~raylab.envs.joystick.JoystickVecEnv` (batched, ``gymnasium.make_vec(...,
vectorization_mode="vector_entry_point")``) and :class:`~raylab.envs.joystick.JoystickEnv`
(one robot, ``gymnasium.make``). Options: ``raylab.envs.tasks.Go2JoystickFlatConfig``.

Observation (49, float32), in this order: gyro x 0.25 (3), projected gravity (3), joint
position - default (12), joint velocity x 0.05 (12), last action (12), command (vx, vy, yaw
rate) (3), sin(2 pi phase) of the 4 feet's gait clock (4; trot: FR and RL together, FL and RR
half a period later).

Tracking error of a trained policy against the commands, and of the policy that holds the
default pose (zero action), on the same seeds::

    python -m raylab.envs.go2 track-error RUN_DIR [--episodes 16] [--seed 1000] [--all] [--sample]
    python -m raylab.envs.go2 track-error            # hold-default-pose baseline only
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import gymnasium as gym
import mujoco
import numpy as np

from raylab.envs import asset_path
from raylab.envs.joystick import (
    JoystickEnv,
    JoystickTask,
    JoystickVecEnv,
    obs_action,
    obs_command,
    obs_foot_phase,
    obs_gravity,
    obs_gyro,
    obs_joint_pos,
    obs_joint_vel,
)
from raylab.envs.managers import ObsTerm
from raylab.envs.tasks import Go2JoystickFlatConfig

LEGS = ("FR", "FL", "RR", "RL")
ACTUATOR_NAMES = tuple(f"{leg}_{part}" for leg in LEGS for part in ("hip", "thigh", "calf"))
NUM_ACTIONS = len(ACTUATOR_NAMES)  # 12
HOME_POSE = (0.0, 0.9, -1.8)  # per leg: hip, thigh, calf (rad)
FOOT_RADIUS = 0.022


@functools.lru_cache(maxsize=None)
def prototype() -> mujoco.MjModel:
    """The compiled Go2-like model, built once per process. Do not modify it: copy it
    (``copy.copy(model)`` is ``mj_copyModel``)."""
    return mujoco.MjModel.from_xml_path(str(asset_path("go2.xml")))


OBSERVATIONS = (
    ObsTerm("gyro", obs_gyro, 3, scale=0.25),
    ObsTerm("projected_gravity", obs_gravity, 3),
    ObsTerm("joint_pos", obs_joint_pos, NUM_ACTIONS),
    ObsTerm("joint_vel", obs_joint_vel, NUM_ACTIONS, scale=0.05),
    ObsTerm("last_action", obs_action, NUM_ACTIONS),
    ObsTerm("command", obs_command, 3),
    ObsTerm("foot_phase", obs_foot_phase, len(LEGS)),
)

TASK = JoystickTask(
    name="go2_joystick_flat",
    config_cls=Go2JoystickFlatConfig,
    model=prototype,
    actuators=ACTUATOR_NAMES,
    feet=LEGS,
    key="home",
    nsubsteps=5,  # 5 x 0.004 s = 50 Hz control
    observations=OBSERVATIONS,
    foot_phase_offsets=(0.0, 0.5, 0.5, 0.0),  # trot: FR + RL, then FL + RR
    foot_radius=FOOT_RADIUS,
    contact_force=1.0,  # N (the robot weighs 149 N)
    fall_up_z=0.5,
)


class Go2JoystickFlatVecEnv(JoystickVecEnv):
    """N Go2-like robots tracking velocity commands on flat ground (batched)."""

    task = TASK


class Go2JoystickFlatEnv(JoystickEnv):
    """One Go2-like robot tracking velocity commands on flat ground."""

    vec_cls = Go2JoystickFlatVecEnv


# ---------------------------------------------------------------------------------------------
# Tracking error of a policy against the commands
# ---------------------------------------------------------------------------------------------

Policy = Callable[[np.ndarray], np.ndarray]  # (N, obs) float32 -> (N, 12) actions


def hold_default_pose(obs: np.ndarray) -> np.ndarray:
    """The baseline: zero action, i.e. the servos hold the default (home) pose."""
    return np.zeros((obs.shape[0], NUM_ACTIONS))


def tracking_error(policy: Policy, vec_cls: type = Go2JoystickFlatVecEnv,
                   options: Optional[Dict[str, Any]] = None, episodes: int = 16,
                   seed: int = 1000, num_threads: int = 1) -> Dict[str, float]:  # fmt: skip
    """Run one episode on each of ``episodes`` envs (env i seeded ``seed + i``) and average,
    over every control step until each episode ends:

    - ``lin_vel_error``: |cmd_xy - v_xy| in the trunk frame (m/s), all steps;
    - ``yaw_rate_error``: |cmd_yaw - yaw rate| (rad/s), all steps;
    - ``lin_vel_error_moving`` / ``yaw_rate_error_moving``: the same over steps whose command
      is not zero; ``lin_vel_error_still``: over zero-command steps;
    - ``command_speed``: mean |cmd_xy| over the moving steps (the error of standing still there);
    - ``survival``: share of episodes that reached the time limit; ``mean_return``;
      ``episode_length``.
    """
    opts = dict(options or {})
    for k in ("num_threads", "allow_overcommit", "autoreset_mode", "info_mode"):
        opts.pop(k, None)
    env = vec_cls(num_envs=episodes, num_threads=num_threads, allow_overcommit=True,
                  info_mode="full", **opts)  # fmt: skip
    try:
        obs, _ = env.reset(seed=seed)
        running = np.ones(episodes, dtype=bool)
        ret, length = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        timed_out = np.zeros(episodes, dtype=bool)
        sums: Dict[str, float] = {k: 0.0 for k in ("lin", "yaw", "lin_m", "yaw_m", "lin_s", "spd")}
        counts = {"all": 0, "moving": 0, "still": 0}
        while running.any():
            obs, reward, term, trunc, info = env.step(policy(obs))
            cmd, v, w = info["command"], info["lin_vel"], info["yaw_rate"]
            e_lin = np.linalg.norm(cmd[:, :2] - v[:, :2], axis=1)
            e_yaw = np.abs(cmd[:, 2] - w)
            moving = np.linalg.norm(cmd, axis=1) > 0.0
            r = running
            sums["lin"] += e_lin[r].sum()
            sums["yaw"] += e_yaw[r].sum()
            sums["lin_m"] += e_lin[r & moving].sum()
            sums["yaw_m"] += e_yaw[r & moving].sum()
            sums["spd"] += np.linalg.norm(cmd[r & moving, :2], axis=1).sum()
            sums["lin_s"] += e_lin[r & ~moving].sum()
            counts["all"] += int(r.sum())
            counts["moving"] += int((r & moving).sum())
            counts["still"] += int((r & ~moving).sum())
            ret[r] += reward[r]
            length[r] += 1
            timed_out |= r & trunc
            running &= ~(term | trunc)
    finally:
        env.close()

    def mean(key, count):
        return float(sums[key] / counts[count]) if counts[count] else float("nan")

    return {
        "episodes": episodes,
        "seed": seed,
        "lin_vel_error": mean("lin", "all"),
        "yaw_rate_error": mean("yaw", "all"),
        "lin_vel_error_moving": mean("lin_m", "moving"),
        "yaw_rate_error_moving": mean("yaw_m", "moving"),
        "lin_vel_error_still": mean("lin_s", "still"),
        "command_speed": mean("spd", "moving"),
        "survival": float(timed_out.mean()),
        "mean_return": float(ret.mean()),
        "episode_length": float(length.mean()),
    }


def checkpoint_policy(checkpoint: Path, action_space, sample: bool = False, seed: int = 0) -> Policy:
    """The policy of an RLlib checkpoint (raylab.evaluate's loader). Deterministic (the mean
    action, ``raylab.evaluate.deterministic_policy``) unless ``sample``: then actions are
    drawn from the policy's Gaussian as during training (torch generator seeded ``seed``),
    clipped to the action space."""
    import torch
    from ray.rllib.core.columns import Columns

    from raylab.evaluate import deterministic_policy, load_policy

    module = load_policy(checkpoint)
    mean_action = deterministic_policy(module, action_space)
    gen = torch.Generator().manual_seed(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        if not sample:
            return mean_action(obs)
        with torch.no_grad():
            out = module.forward_inference({Columns.OBS: torch.as_tensor(obs, dtype=torch.float32)})
            mean, log_std = out[Columns.ACTION_DIST_INPUTS].chunk(2, dim=-1)
            a = mean + log_std.exp() * torch.randn(mean.shape, generator=gen)
        return np.clip(a.numpy(), action_space.low, action_space.high)

    return act


def _run_options(run: Path):
    """The env options and the config of a go2_joystick_flat run directory."""
    from raylab.algorithms.build import env_options
    from raylab.errors import UserError
    from raylab.train import load_run_config

    cfg = load_run_config(run)
    if cfg.task != TASK.name:
        raise UserError(f"run '{run}' trained task '{cfg.task}', not {TASK.name}")
    return env_options(cfg), cfg


def _fmt(name: str, s: Dict[str, float]) -> str:
    return (
        f"{name:<28} lin {s['lin_vel_error']:.3f} m/s (moving {s['lin_vel_error_moving']:.3f}, "
        f"still {s['lin_vel_error_still']:.3f})  yaw {s['yaw_rate_error']:.3f} rad/s "
        f"(moving {s['yaw_rate_error_moving']:.3f})  survival {s['survival']:.2f}  "
        f"return {s['mean_return']:.2f}  length {s['episode_length']:.0f}"
    )


def track_error_main(argv=None) -> int:
    from raylab.errors import UserError

    p = argparse.ArgumentParser(
        prog="python -m raylab.envs.go2 track-error",
        description="Velocity tracking error of a trained go2_joystick_flat policy and of the "
        "hold-default-pose policy, on the same fixed-seed episodes.",
    )
    p.add_argument("run_dir", nargs="?", help="raylab run directory (omit: baseline only)")
    p.add_argument("--checkpoint", help="checkpoint to use (default: the run's last)")
    p.add_argument("--all", action="store_true", help="evaluate every checkpoint of the run")
    p.add_argument("--sample", action="store_true",
                   help="also evaluate the policy with sampled actions (as it acts in training)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="JSON file (default: RUN_DIR/track_error.json)")
    a = p.parse_args(argv)
    try:
        if a.episodes < 1:
            raise UserError(f"--episodes {a.episodes}: must be at least 1")
        options: Dict[str, Any] = {}
        ckpts = []
        if a.run_dir:
            from raylab.evaluate import check_checkpoint, find_checkpoints

            run = Path(a.run_dir).resolve()  # RLlib loads modules from absolute paths only
            options, cfg = _run_options(run)
            found = find_checkpoints(run)
            if a.checkpoint:
                ckpts = [Path(a.checkpoint).resolve()]
            elif a.all:
                ckpts = found
            else:
                ckpts = found[-1:]
            if not ckpts:
                raise UserError(f"no checkpoint in '{run}'; train first or pass --checkpoint")
            for c in ckpts:
                check_checkpoint(c, cfg.algo.name)
        kw = dict(options=options, episodes=a.episodes, seed=a.seed, num_threads=a.threads)
        results = {"hold_default_pose": tracking_error(hold_default_pose, **kw)}
        print(_fmt("hold default pose", results["hold_default_pose"]), flush=True)
        space = gym.spaces.Box(-1.0, 1.0, (NUM_ACTIONS,), np.float32)
        for c in ckpts:
            results[str(c)] = tracking_error(checkpoint_policy(c, space), **kw)
            print(_fmt(c.name, results[str(c)]), flush=True)
            if a.sample:
                key = f"{c} (sampled)"
                results[key] = tracking_error(checkpoint_policy(c, space, sample=True), **kw)
                print(_fmt(f"{c.name} sampled", results[key]), flush=True)
        out = Path(a.out) if a.out else (Path(a.run_dir) / "track_error.json" if a.run_dir else None)
        if out is not None:
            out.write_text(json.dumps(results, indent=2))
            print(f"wrote {out}", file=sys.stderr)
        return 0
    except UserError as e:
        print(f"raylab: error: {e}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("track-error",)
    if not argv or argv[0] not in commands:
        got = argv[0] if argv else "nothing"
        print(f"unknown command {got!r}; valid choices: {', '.join(commands)}", file=sys.stderr)
        return 2
    return track_error_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
