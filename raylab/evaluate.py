"""Evaluation of trained policies: ``raylab eval``, the baselines, the track-error tool, video.

The episodes themselves are run by :func:`raylab.algorithms.evaluation.run_policy_episodes`,
the code the evaluation during training runs too (its docstring has the seeding, survival and
tracking-error rules).

``raylab eval`` prints mean return, survival, episode length (and tracking errors), on a task
that pushes the robot the headroom taken (:func:`headroom`, next to the baselines it is
measured between, on the same seeds), writes
``eval.json`` into the run directory and, with ``--video``, renders ``play_video.mp4`` of the
first episode with MuJoCo's offscreen renderer (EGL or OSMesa when there is no GPU).

Tracking errors of every checkpoint of a joystick run next to holding the default pose, with
the policy's deterministic and (``--sample``) sampled actions, on the same seeds::

    python -m raylab.evaluate track-error RUN_DIR [--episodes 16] [--seed 1000] [--all] [--sample]
    python -m raylab.evaluate track-error --task go2_joystick_flat    # the baseline only
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from raylab.algorithms.algorithm import LEARNER_MODULE_DIR
from raylab.algorithms.evaluation import (
    MAX_EVAL_ENVS,
    Policy,
    deterministic_policy,
    eval_vec_env,
    hold_pose_policy,
    random_policy,
    run_policy_episodes,
    sampled_policy,
)
from raylab.errors import UserError
from raylab.train import TUNE_DIR, load_run_config

# ---------------------------------------------------------------------------------- episodes


def make_eval_env(cfg, num_envs: int, num_threads: Optional[int] = None):
    """A vector env built like the training env of ``cfg``: see :func:`eval_vec_env`."""
    from raylab.algorithms.build import env_id_for_runner, env_options
    from raylab.envs.tasks import TASKS

    options = env_options(cfg, evaluation=True)
    if num_threads is not None and cfg.task in TASKS:
        options["num_threads"] = int(num_threads)
    return eval_vec_env(env_id_for_runner(cfg), options, num_envs, batched=cfg.task in TASKS)


def eval_line(stats: Dict[str, Any]) -> str:
    """One line of an evaluation's numbers (what ``raylab eval`` prints)."""
    text = f"mean return {stats['mean_return']:.2f} +/- {stats['std_return']:.2f}"
    if stats.get("headroom") is not None:
        b = stats["baselines"]
        text += (
            f"   headroom {stats['headroom']:.3f} (hold-pose {b['hold_pose']:.1f}, "
            f"no-push {b['no_push']:.1f})"
        )
    if stats.get("survival") is not None:
        text += f"   survival {stats['survival']:.3f}"
    text += f"   episode length {stats['mean_episode_length']:.1f}"
    if stats.get("lin_vel_error_moving") is not None:
        text += (
            f"   tracking error (moving commands) lin {stats['lin_vel_error_moving']:.3f} m/s, "
            f"yaw {stats['yaw_rate_error_moving']:.3f} rad/s"
        )
    return text


def push_line(stats: Dict[str, Any]) -> str:
    """The push table in one line: per push speed, the pushes that felled the robot."""
    cells = [
        f"{r['speed'][0]:.2f}-{r['speed'][1]:.2f} {r['felled']}/{r['pushes']}"
        for r in stats["push_table"]
    ]
    return (
        "felled by pushes of (m/s): "
        + ", ".join(cells)
        + f"; fell unpushed: {stats.get('fell_unpushed', 0)}"
    )


# ---------------------------------------------------------------------------------- baselines


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def baseline_scores(
    cfg, episodes: int = 100, seed: int = 1000, cache_dir: Optional[Path] = None
) -> Dict[str, Dict[str, Any]]:
    """Hold-pose (zero action) and random-action scores on the task of ``cfg``, by
    :func:`run_policy_episodes` with the evaluation's protocol. Cached per task options under
    ``$XDG_CACHE_HOME/raylab/baselines`` (default ``~/.cache``; they take seconds to compute)."""
    import hashlib

    from raylab.algorithms.build import env_options

    cfg = stand_config(cfg)
    options = {k: v for k, v in env_options(cfg, evaluation=True).items() if k != "num_threads"}
    key = json.dumps(
        {
            "task": cfg.task,
            "options": options,
            "episodes": episodes,
            "seed": seed,
            "policies": ["hold_pose", "random"] + (["no_push"] if pushes(cfg) else []),
        },
        sort_keys=True,
        default=str,
    )
    folder = Path(cache_dir) if cache_dir is not None else _cache_root() / "raylab" / "baselines"
    path = (
        folder / f"{cfg.task.replace('/', '_')}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"
    )
    if path.is_file():
        try:
            return json.loads(path.read_text())["scores"]
        except (ValueError, KeyError):
            pass  # a broken cache file is recomputed
    from raylab.envs.core.backend import usable_cores

    env = make_eval_env(cfg, min(episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
    try:
        space = env.single_action_space
        scores = {
            "hold_pose": run_policy_episodes(hold_pose_policy(space), env, episodes, seed),
            "random": run_policy_episodes(random_policy(space, seed), env, episodes, seed),
        }
    finally:
        env.close()
    if pushes(cfg):  # the headroom's ceiling: the same task, nobody pushes
        quiet = no_push_config(cfg)
        env = make_eval_env(quiet, min(episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
        try:
            policy = hold_pose_policy(env.single_action_space)
            scores["no_push"] = run_policy_episodes(policy, env, episodes, seed)
        finally:
            env.close()
    for s in scores.values():
        for per_episode in ("returns", "lengths", "survivals"):
            s.pop(per_episode, None)
    folder.mkdir(parents=True, exist_ok=True)
    from raylab.metrics.rundir import write_json_atomic

    write_json_atomic(path, {"key": json.loads(key), "scores": scores})
    return scores


def pushes(cfg) -> bool:
    """Whether the task pushes the robot (``env.num_pushes`` above 0): its yardstick is the
    headroom between holding the pose and holding it unpushed."""
    return int(cfg.env.get("num_pushes", 0) or 0) > 0


def _with_env(cfg, **values):
    import copy

    from omegaconf import OmegaConf

    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, False)
    for k, v in values.items():
        out.env[k] = v
    OmegaConf.set_readonly(out, True)
    return out


def no_push_config(cfg):
    """The same task and options with nobody pushing (``env.num_pushes=0``)."""
    return _with_env(cfg, num_pushes=0)


def stand_config(cfg):
    """The options the do-nothing baselines run with: the run's, but a zero action holds the
    task's stand pose (``env.residual_reference`` off: there a zero action walks the reference
    gait open loop, which is a policy's starting point, not doing nothing)."""
    return _with_env(cfg, residual_reference=False) if cfg.env.get("residual_reference") else cfg


def headroom(mean_return: float, scores: Dict[str, Dict[str, Any]]) -> Optional[float]:
    """(return - hold-pose) / (no-push return - hold-pose): the share of what pushes cost a
    policy that holds the pose which a policy wins back (0: holds the pose, 1: as if nobody
    pushed). None for a task without pushes."""
    if "no_push" not in scores:
        return None
    hold = scores["hold_pose"]["mean_return"]
    return (mean_return - hold) / (scores["no_push"]["mean_return"] - hold)


# ---------------------------------------------------------------------------------- checkpoints


def find_checkpoints(run_dir: Path) -> list[Path]:
    """Algorithm checkpoints of a run (Tune's, not the copy of the best), oldest first."""
    found = sorted((run_dir / TUNE_DIR).glob("*/checkpoint_*"), key=lambda p: p.name)
    return [p for p in found if p.is_dir()]


def best_checkpoint(run_dir: Path) -> Path:
    """The copy of the checkpoint with the best evaluation score (``checkpoints/best``)."""
    from raylab.metrics.rundir import CHECKPOINT_DIR

    return run_dir / CHECKPOINT_DIR / "best"


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
    if name is None or not (path / LEARNER_MODULE_DIR).is_dir():
        raise UserError(f"'{path}' is not a readable RLlib algorithm checkpoint")
    from raylab.train import algorithm_class

    expected = algorithm_class(algo).__name__
    # Checkpoints written before raylab had its own PPO / APPO classes name RLlib's.
    if name not in (expected, expected.replace("Raylab", "", 1)):
        raise UserError(
            f"checkpoint '{path}' was written by {name}, but this run trains {expected} "
            f"(--algo {algo}); pick a checkpoint of this run"
        )


def load_policy(path: Path):
    from ray.rllib.core.rl_module.rl_module import RLModule

    from raylab.algorithms.activations import use_fast_tanh
    from raylab.quiet import quiet_logs

    quiet_logs()  # RLlib's deprecation notices while it rebuilds the module
    try:
        module = RLModule.from_checkpoint(str((path / LEARNER_MODULE_DIR).resolve()))
    except Exception as e:  # corrupt state files
        raise UserError(f"cannot load the policy in '{path}': {type(e).__name__}: {e}") from e
    use_fast_tanh(module)  # the function the run's EnvRunners computed
    return module


# ---------------------------------------------------------------------------------- video


def _video_env(cfg):
    """The task's single (reference) env with the run's options, for rendering."""
    import gymnasium as gym

    import raylab.envs  # noqa: F401
    from raylab.algorithms.build import env_options
    from raylab.envs.tasks import VECTOR_ONLY_OPTIONS

    kwargs = env_options(cfg, evaluation=True)
    for k in VECTOR_ONLY_OPTIONS:
        kwargs.pop(k, None)
    return gym.make(cfg.env.gym_id, **kwargs)


def render_episode(policy: Policy, cfg, seed: int, path: Path) -> int:
    """Render one episode (``reset(seed=seed)``) of ``policy`` to an MP4; returns its frames."""
    env = _video_env(cfg)
    renderer = _Renderer(env)
    frames = []
    try:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = policy(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(renderer.render())
            done = bool(terminated or truncated)
    finally:
        renderer.close()
        env.close()
    fps = env.metadata.get("render_fps") if hasattr(env, "metadata") else None
    _write_video(frames, path, fps=int(fps or 50))
    return len(frames)


class _Renderer:
    """MuJoCo offscreen renderer following the robot (EGL unless MUJOCO_GL says otherwise: the
    platform is chosen in ``raylab/__init__.py``, before anything imports mujoco)."""

    def __init__(self, env, width: int = 640, height: int = 480):  # x264 wants multiples of 16
        import mujoco

        base = env.unwrapped
        self.model, self.data = base.model, base.data
        try:
            self.renderer = mujoco.Renderer(self.model, height, width)
        except Exception as e:
            raise UserError(
                "offscreen rendering is unavailable "
                f"(MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}): {e}; "
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


# ---------------------------------------------------------------------------------- raylab eval


def evaluate(
    run_dir: str,
    checkpoint: Optional[str],
    episodes: int,
    seed: int,
    video: bool,
    trust_checkpoint: bool = False,
) -> int:
    from raylab.metrics.rundir import check_trusted_checkpoint

    run = Path(run_dir)
    cfg = load_run_config(run)
    if episodes < 1:
        raise UserError(f"--episodes {episodes}: must be at least 1")
    if checkpoint is None:
        found = find_checkpoints(run)
        if not found:
            raise UserError(
                f"no checkpoint in '{run / TUNE_DIR}'; train first or pass --checkpoint"
            )
        ckpt = found[-1]
    elif checkpoint == "best":
        ckpt = best_checkpoint(run)
        if not ckpt.is_dir():
            raise UserError(
                f"no best checkpoint in '{ckpt.parent}': the run evaluated nothing "
                "(training.eval_every=0 and training.eval_before_train=false)"
            )
    else:
        ckpt = Path(checkpoint)
    check_trusted_checkpoint(ckpt, run, trust_checkpoint)
    check_checkpoint(ckpt, cfg.algo.name)
    module = load_policy(ckpt)
    from raylab.envs.core.backend import usable_cores

    env = make_eval_env(cfg, min(episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
    print(f"raylab: evaluating {ckpt} on {cfg.task}, {episodes} episodes", file=sys.stderr)
    try:
        policy = deterministic_policy(module, env.single_action_space)
        stats = run_policy_episodes(policy, env, episodes, seed)
    finally:
        env.close()
    stats.update({"checkpoint": str(ckpt), "task": cfg.task, "algo": cfg.algo.name})
    if pushes(cfg):  # the task's yardstick: the headroom taken, on the same seeds
        scores = baseline_scores(cfg, episodes=episodes, seed=seed)
        stats["baselines"] = {k: v["mean_return"] for k, v in scores.items()}
        stats["headroom"] = headroom(stats["mean_return"], scores)
    video_path = run / "play_video.mp4" if video else None
    if video_path is not None:
        stats["video"] = str(video_path)
        stats["video_frames"] = render_episode(policy, cfg, seed, video_path)
        _upload_video(cfg, run, video_path)
    (run / "eval.json").write_text(json.dumps(stats, indent=2))
    print(eval_line(stats))
    if stats.get("push_table"):
        print(push_line(stats))
    print(
        f"raylab: wrote {run / 'eval.json'}" + (f" and {video_path}" if video else ""),
        file=sys.stderr,
    )
    return 0


def _upload_video(cfg, run: Path, video_path: Path) -> None:
    if cfg.training.logger != "wandb":
        return
    from raylab.config import to_dict
    from raylab.metrics.backends import make_backend

    backend = make_backend(cfg.training, run, to_dict(cfg))
    try:
        backend.upload_video(video_path)
    finally:
        backend.close()


# ---------------------------------------------------------------------------------- track-error

JOYSTICK_TASKS = ("go2_joystick_flat", "microduck_joystick")


def _track_line(name: str, s: Dict[str, Any]) -> str:
    return (
        f"{name:<28} lin {s['lin_vel_error']:.3f} m/s (moving {s['lin_vel_error_moving']:.3f}, "
        f"still {s['lin_vel_error_still']:.3f})  yaw {s['yaw_rate_error']:.3f} rad/s "
        f"(moving {s['yaw_rate_error_moving']:.3f})  survival {s['survival']:.2f}  "
        f"return {s['mean_return']:.2f}  length {s['mean_episode_length']:.0f}"
    )


def track_error_main(argv=None) -> int:
    """``python -m raylab.evaluate track-error``: see the module docstring."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m raylab.evaluate track-error",
        description="Velocity tracking errors of a trained joystick policy and of holding the "
        "default pose, on the same fixed-seed episodes.",
    )
    p.add_argument("run_dir", nargs="?", help="raylab run directory (omit: the baseline only)")
    p.add_argument(
        "--task",
        choices=JOYSTICK_TASKS,
        default=None,
        help="task of the baseline without a run (default go2_joystick_flat)",
    )
    p.add_argument("--checkpoint", help="checkpoint to use (default: the run's last)")
    p.add_argument("--all", action="store_true", help="evaluate every checkpoint of the run")
    p.add_argument(
        "--sample",
        action="store_true",
        help="also evaluate the policy with sampled actions (as it acts in training)",
    )
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--out", help="JSON file (default: RUN_DIR/track_error.json)")
    a = p.parse_args(argv)
    try:
        if a.episodes < 1:
            raise UserError(f"--episodes {a.episodes}: must be at least 1")
        ckpts: list[Path] = []
        if a.run_dir:
            run = Path(a.run_dir).resolve()  # RLlib loads modules from absolute paths only
            cfg = load_run_config(run)
            if cfg.task not in JOYSTICK_TASKS:
                raise UserError(
                    f"run '{run}' trained task '{cfg.task}'; track-error needs one "
                    f"of {', '.join(JOYSTICK_TASKS)}"
                )
            found = find_checkpoints(run)
            ckpts = (
                [Path(a.checkpoint).resolve()] if a.checkpoint else found if a.all else found[-1:]
            )
            if not ckpts:
                raise UserError(f"no checkpoint in '{run}'; train first or pass --checkpoint")
            for c in ckpts:
                check_checkpoint(c, cfg.algo.name)
        else:
            from raylab.config import compose

            cfg = compose("ppo", a.task or JOYSTICK_TASKS[0], "mujoco", [])
        from raylab.envs.core.backend import usable_cores

        env = make_eval_env(cfg, min(a.episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
        space = env.single_action_space
        results: Dict[str, Any] = {}

        def run_one(key: str, name: str, policy: Policy, on=None) -> None:
            stats = run_policy_episodes(policy, env if on is None else on, a.episodes, a.seed)
            for per_episode in ("returns", "lengths", "survivals"):
                stats.pop(per_episode, None)
            results[key] = stats
            print(_track_line(name, stats), flush=True)

        try:
            # with residual actions a zero action walks the reference: hold the pose on an env
            # with the plain action mapping
            stand = stand_config(cfg)
            hold_env = env if stand is cfg else make_eval_env(stand, env.num_envs, usable_cores())
            try:
                run_one("hold_default_pose", "hold default pose", hold_pose_policy(space), hold_env)
            finally:
                if hold_env is not env:
                    hold_env.close()
            for c in ckpts:
                module = load_policy(c)
                run_one(str(c), c.name, deterministic_policy(module, space))
                if a.sample:
                    run_one(f"{c} (sampled)", f"{c.name} sampled", sampled_policy(module, space))
        finally:
            env.close()
        out = (
            Path(a.out) if a.out else (Path(a.run_dir) / "track_error.json" if a.run_dir else None)
        )
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
        print(
            f"raylab: error: unknown command {got!r}; valid choices: {', '.join(commands)}",
            file=sys.stderr,
        )
        return 2
    return track_error_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
