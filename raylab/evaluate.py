"""`raylab eval`: run a trained policy deterministically on fixed-seed episodes.

The policy is the RLModule saved in an RLlib checkpoint of the run; the env is the task's
single (reference) environment with the run's options. Prints mean return, survival and
episode length, writes ``eval.json`` into the run directory and, with ``--video``, renders
``play_video.mp4`` with MuJoCo's offscreen renderer (EGL or OSMesa when there is no GPU).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from raylab.errors import UserError
from raylab.train import TUNE_DIR, load_run_config

MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"


def find_checkpoints(run_dir: Path) -> list[Path]:
    """Algorithm checkpoints of a run, oldest first."""
    found = sorted((run_dir / TUNE_DIR).glob("*/checkpoint_*"), key=lambda p: p.name)
    return [p for p in found if p.is_dir()]


def checkpoint_algorithm(path: Path) -> Optional[str]:
    """The algorithm class name stored in an RLlib Algorithm checkpoint."""
    meta = path / "class_and_ctor_args.pkl"
    if not meta.is_file():
        return None
    try:
        with open(meta, "rb") as f:
            data = pickle.load(f)
    except Exception:  # a corrupt file is reported by the caller as a bad checkpoint
        return None
    cls = data.get("class") if isinstance(data, dict) else None
    return getattr(cls, "__name__", None)


def check_checkpoint(path: Path, algo: str) -> None:
    """One clear line when a checkpoint is missing, corrupt or from another algorithm."""
    if not path.is_dir():
        raise UserError(f"checkpoint '{path}' does not exist")
    name = checkpoint_algorithm(path)
    if name is None or not (path / MODULE_SUBDIR).is_dir():
        raise UserError(f"'{path}' is not a readable RLlib algorithm checkpoint")
    from raylab.train import algorithm_class

    expected = algorithm_class(algo).__name__
    if name != expected:
        raise UserError(
            f"checkpoint '{path}' was written by {name}, but this run trains {expected} "
            f"(--algo {algo}); pick a checkpoint of this run"
        )


def load_policy(path: Path):
    from ray.rllib.core.rl_module.rl_module import RLModule

    from raylab.quiet import quiet_logs

    quiet_logs()  # RLlib's deprecation notices while it rebuilds the module
    try:
        return RLModule.from_checkpoint(str((path / MODULE_SUBDIR).resolve()))
    except Exception as e:  # corrupt state files
        raise UserError(f"cannot load the policy in '{path}': {type(e).__name__}: {e}") from e


def policy_action(module, obs: np.ndarray, action_space) -> np.ndarray:
    """Deterministic action for one observation, in the env's action space."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(obs[None], dtype=torch.float32)})
        dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        action = dist.to_deterministic().sample()[0].cpu().numpy()
    # RLlib trains in a normalised [-1, 1] action space (normalize_actions=True).
    return np.clip(unsquash_action(action, action_space), action_space.low, action_space.high)


def make_eval_env(cfg, render: bool = False):
    import gymnasium as gym

    import raylab.envs  # noqa: F401  (registers raylab tasks)
    from raylab.algorithms.build import env_options

    kwargs = env_options(cfg)
    kwargs.pop("num_threads", None)
    kwargs.pop("allow_overcommit", None)
    kwargs.pop("autoreset_mode", None)
    return gym.make(cfg.env.gym_id, **kwargs)


def run_episodes(module, env, episodes: int, seed: int, video_path: Optional[Path] = None):
    returns, lengths, survival = [], [], []
    frames = []
    renderer = None
    if video_path is not None:
        renderer = _Renderer(env)
    for i in range(episodes):
        obs, info = env.reset(seed=seed + i)
        ep_ret, ep_len, alive = 0.0, 0, []
        done = False
        while not done:
            action = policy_action(module, np.asarray(obs, dtype=np.float32), env.action_space)
            obs, reward, terminated, truncated, info = env.step(action)
            ep_ret += float(reward)
            ep_len += 1
            if "fallen" in info:
                alive.append(not bool(info["fallen"]))
            done = bool(terminated or truncated)
            if renderer is not None and i == 0:
                frames.append(renderer.render())
        returns.append(ep_ret)
        lengths.append(ep_len)
        # Survival: an episode that terminated (a joystick robot that fell) survived none of
        # it; otherwise the share of its steps on which the robot was not fallen, by the task's
        # own definition (info["fallen"]; Microduck balance: raylab.envs.microduck.is_fallen),
        # or all of it where the task reports none.
        survival.append(0.0 if terminated else float(np.mean(alive)) if alive else 1.0)
    if renderer is not None:
        renderer.close()
        _write_video(frames, video_path, fps=_control_fps(env))
    return {
        "episodes": episodes,
        "seeds": [seed + i for i in range(episodes)],
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "returns": returns,
        "mean_episode_length": float(np.mean(lengths)),
        "survival": float(np.mean(survival)),
    }


def _control_fps(env) -> int:
    fps = env.metadata.get("render_fps") if hasattr(env, "metadata") else None
    return int(fps or 50)


class _Renderer:
    """MuJoCo offscreen renderer following the robot (EGL unless MUJOCO_GL says otherwise)."""

    def __init__(self, env, width: int = 480, height: int = 360):
        os.environ.setdefault("MUJOCO_GL", "egl")
        import mujoco

        base = env.unwrapped
        self.model, self.data = base.model, base.data
        try:
            self.renderer = mujoco.Renderer(self.model, height, width)
        except Exception as e:
            raise UserError(
                f"offscreen rendering is unavailable (MUJOCO_GL={os.environ['MUJOCO_GL']}): {e}; "
                "install libegl-mesa0 (or libosmesa6 and set MUJOCO_GL=osmesa)"
            ) from e
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        self.camera.trackbodyid = 1
        self.camera.distance = max(0.6, 3.0 * float(self.model.stat.extent) * 0.5)
        self.camera.elevation = -20.0
        self.camera.azimuth = 135.0

    def render(self) -> np.ndarray:
        self.renderer.update_scene(self.data, camera=self.camera)
        return self.renderer.render().copy()

    def close(self) -> None:
        self.renderer.close()


def _write_video(frames, path: Path, fps: int) -> None:
    import imageio.v2 as imageio

    with imageio.get_writer(str(path), fps=fps, codec="libx264", quality=7) as writer:
        for frame in frames:
            writer.append_data(frame)


def evaluate(run_dir: str, checkpoint: Optional[str], episodes: int, seed: int, video: bool) -> int:
    run = Path(run_dir)
    cfg = load_run_config(run)
    if episodes < 1:
        raise UserError(f"--episodes {episodes}: must be at least 1")
    if checkpoint is None:
        found = find_checkpoints(run)
        if not found:
            raise UserError(f"no checkpoint in '{run / TUNE_DIR}'; train first or pass --checkpoint")
        ckpt = found[-1]
    else:
        ckpt = Path(checkpoint)
    check_checkpoint(ckpt, cfg.algo.name)
    module = load_policy(ckpt)
    env = make_eval_env(cfg)
    video_path = run / "play_video.mp4" if video else None
    print(f"raylab: evaluating {ckpt} on {cfg.task}, {episodes} episodes", file=sys.stderr)
    stats = run_episodes(module, env, episodes, seed, video_path)
    env.close()
    stats.update({"checkpoint": str(ckpt), "task": cfg.task, "algo": cfg.algo.name})
    if video_path is not None:
        stats["video"] = str(video_path)
        _upload_video(cfg, run, video_path)
    (run / "eval.json").write_text(json.dumps(stats, indent=2))
    print(
        f"mean return {stats['mean_return']:.2f} +/- {stats['std_return']:.2f}   "
        f"survival {stats['survival']:.3f}   episode length {stats['mean_episode_length']:.1f}"
    )
    print(f"raylab: wrote {run / 'eval.json'}" + (f" and {video_path}" if video else ""), file=sys.stderr)
    return 0


def _upload_video(cfg, run: Path, video_path: Path) -> None:
    if cfg.training.logger != "wandb":
        return
    from raylab.metrics.backends import make_backend

    from raylab.config import to_dict

    backend = make_backend(cfg.training, run, to_dict(cfg))
    try:
        backend.upload_video(video_path)
    finally:
        backend.close()
