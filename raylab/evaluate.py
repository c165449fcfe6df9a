"""Evaluation: a policy run deterministically on fixed-seed episodes.

One code path serves ``raylab eval`` and the evaluation during training (RLlib's evaluation
EnvRunner, :class:`~raylab.algorithms.env_runner.RaylabEvalEnvRunner`, calls
:func:`run_policy_episodes` on its own vector env) and the baselines the plots draw (hold-pose
and random actions, :func:`baseline_scores`):

- episode ``k`` of an evaluation starts from ``reset(seed=seed + k)``, whatever the number of
  envs it runs on: rounds of ``num_envs`` episodes, each round a fresh seeded reset of the
  vector env (env ``i`` of a round seeded ``seed + first + i``), one episode per env;
- actions are the policy's deterministic ones (the mean of its Gaussian), in the env's units;
- survival is the task's own definition: the share of an episode's steps on which
  ``info["fallen"]`` is false (Microduck balance: :func:`raylab.envs.microduck.is_fallen`), and
  0 for an episode that terminated (a joystick robot that fell); tasks without ``fallen``
  (Gymnasium ids) report none;
- joystick tasks also report tracking errors, |cmd_xy - v_xy| (m/s) and |cmd_yaw - yaw rate|
  (rad/s) averaged over the steps with a non-zero command (``_moving``) and over all steps.

``raylab eval`` prints mean return, survival, episode length (and tracking errors), writes
``eval.json`` into the run directory and, with ``--video``, renders ``play_video.mp4`` of the
first episode with MuJoCo's offscreen renderer (EGL or OSMesa when there is no GPU).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np

from raylab.errors import UserError
from raylab.train import TUNE_DIR, load_run_config

MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"
# Envs stepped at once by an evaluation (fewer when it runs fewer episodes).
MAX_EVAL_ENVS = 100

Policy = Callable[[np.ndarray], np.ndarray]  # (N, obs) float32 -> (N, action) in env units


# ---------------------------------------------------------------------------------- policies


def deterministic_policy(module, action_space) -> Policy:
    """An RLModule's deterministic action for a batch of observations, in the env's units.

    RLlib trains in a normalised [-1, 1] action space (``normalize_actions=True``); the action
    is unsquashed into ``action_space`` and clipped to it."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    dist_cls = module.get_inference_action_dist_cls()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module.forward_inference({Columns.OBS: torch.as_tensor(obs, dtype=torch.float32)})
            dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
            action = dist.to_deterministic().sample().cpu().numpy()
        return np.clip(unsquash_action(action, action_space), action_space.low, action_space.high)

    return act


def hold_pose_policy(action_space) -> Policy:
    """The do-nothing baseline: zero action (robot tasks: the servos hold the stand pose)."""
    return lambda obs: np.zeros((obs.shape[0], *action_space.shape), dtype=action_space.dtype)


def random_policy(action_space, seed: int = 0) -> Policy:
    """Uniform random actions (numpy generator seeded ``seed``)."""
    rng = np.random.default_rng(seed)
    low, high = action_space.low, action_space.high
    return lambda obs: rng.uniform(low, high, size=(obs.shape[0], *action_space.shape)).astype(
        action_space.dtype
    )


# ---------------------------------------------------------------------------------- episodes


def make_eval_env(cfg, num_envs: int, num_threads: Optional[int] = None):
    """A vector env built like the training env of ``cfg``: see :func:`eval_vec_env`."""
    from raylab.algorithms.build import env_id_for_runner, env_options
    from raylab.envs.tasks import TASKS

    options = env_options(cfg)
    if num_threads is not None and cfg.task in TASKS:
        options["num_threads"] = int(num_threads)
    return eval_vec_env(env_id_for_runner(cfg), options, num_envs, batched=cfg.task in TASKS)


def eval_vec_env(env_id: str, options: Dict[str, Any], num_envs: int, batched: bool):
    """The evaluation vector env: the training env's id and options; for raylab tasks their
    batched env with per-env infos and NEXT_STEP autoreset (what :func:`run_policy_episodes`
    reads), for any other Gymnasium id Gymnasium's SyncVectorEnv."""
    import gymnasium as gym

    import raylab.envs  # noqa: F401  (registers raylab tasks)

    options = dict(options)
    if not batched:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", **options)
    options["num_threads"] = max(1, min(int(options.get("num_threads", 1)), num_envs))
    options.update(autoreset_mode="next_step", info_mode="full")
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **options)


def run_policy_episodes(policy: Policy, env, episodes: int, seed: int) -> Dict[str, Any]:
    """Run ``episodes`` episodes of ``policy`` on the vector ``env`` (see the module docstring
    for the seeding and survival rules) and return their statistics."""
    n = int(env.num_envs)
    returns, lengths, survival = [], [], []
    has_fallen = tracks = False
    err = {k: 0.0 for k in ("lin", "yaw", "lin_m", "yaw_m")}
    n_all = n_moving = 0
    for first in range(0, episodes, n):
        m = min(n, episodes - first)
        obs, _ = env.reset(seed=seed + first)
        running = np.zeros(n, dtype=bool)
        running[:m] = True
        ret, length = np.zeros(n), np.zeros(n, dtype=np.int64)
        alive, terminated = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        while running.any():
            obs, reward, term, trunc, info = env.step(policy(np.asarray(obs, dtype=np.float32)))
            r = running
            ret[r] += np.asarray(reward, dtype=np.float64)[r]
            length[r] += 1
            if "fallen" in info:
                has_fallen = True
                alive[r] += ~np.asarray(info["fallen"], dtype=bool)[r]
            if "command" in info:
                tracks = True
                cmd = np.asarray(info["command"])[r]
                e_lin = np.linalg.norm(cmd[:, :2] - np.asarray(info["lin_vel"])[r, :2], axis=1)
                e_yaw = np.abs(cmd[:, 2] - np.asarray(info["yaw_rate"])[r])
                moving = np.linalg.norm(cmd, axis=1) > 0.0
                err["lin"] += e_lin.sum()
                err["yaw"] += e_yaw.sum()
                err["lin_m"] += e_lin[moving].sum()
                err["yaw_m"] += e_yaw[moving].sum()
                n_all += int(r.sum())
                n_moving += int(moving.sum())
            terminated |= r & np.asarray(term, dtype=bool)
            running &= ~(np.asarray(term, dtype=bool) | np.asarray(trunc, dtype=bool))
        returns += ret[:m].tolist()
        lengths += length[:m].tolist()
        survival += [0.0 if terminated[i] else alive[i] / length[i] for i in range(m)]
    out: Dict[str, Any] = {
        "episodes": episodes,
        "seeds": [seed, seed + episodes - 1],
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "returns": [float(x) for x in returns],
        "lengths": [int(x) for x in lengths],
        "mean_episode_length": float(np.mean(lengths)),
        "survival": float(np.mean(survival)) if has_fallen else None,
        "survivals": [float(x) for x in survival] if has_fallen else None,
    }
    if tracks:

        def mean(total: float, count: int) -> Optional[float]:
            return float(total / count) if count else None

        out.update(
            lin_vel_error_moving=mean(err["lin_m"], n_moving),
            yaw_rate_error_moving=mean(err["yaw_m"], n_moving),
            lin_vel_error=mean(err["lin"], n_all),
            yaw_rate_error=mean(err["yaw"], n_all),
        )
    return out


def eval_line(stats: Dict[str, Any]) -> str:
    """One line of an evaluation's numbers (what ``raylab eval`` prints)."""
    text = f"mean return {stats['mean_return']:.2f} +/- {stats['std_return']:.2f}"
    if stats.get("survival") is not None:
        text += f"   survival {stats['survival']:.3f}"
    text += f"   episode length {stats['mean_episode_length']:.1f}"
    if stats.get("lin_vel_error_moving") is not None:
        text += (
            f"   tracking error (moving commands) lin {stats['lin_vel_error_moving']:.3f} m/s, "
            f"yaw {stats['yaw_rate_error_moving']:.3f} rad/s"
        )
    return text


# ---------------------------------------------------------------------------------- baselines

def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def baseline_scores(cfg, episodes: int = 100, seed: int = 1000,
                    cache_dir: Optional[Path] = None) -> Dict[str, Dict[str, Any]]:  # fmt: skip
    """Hold-pose (zero action) and random-action scores on the task of ``cfg``, by
    :func:`run_policy_episodes` with the evaluation's protocol. Cached per task options under
    ``$XDG_CACHE_HOME/raylab/baselines`` (default ``~/.cache``; they take seconds to compute)."""
    import hashlib

    from raylab.algorithms.build import env_options

    options = {k: v for k, v in env_options(cfg).items() if k != "num_threads"}
    key = json.dumps({"task": cfg.task, "options": options, "episodes": episodes, "seed": seed},
                     sort_keys=True, default=str)  # fmt: skip
    folder = Path(cache_dir) if cache_dir is not None else _cache_root() / "raylab" / "baselines"
    path = folder / f"{cfg.task.replace('/', '_')}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())["scores"]
        except (ValueError, KeyError):
            pass  # a broken cache file is recomputed
    from raylab.envs.backend import usable_cores

    env = make_eval_env(cfg, min(episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
    try:
        space = env.single_action_space
        scores = {
            "hold_pose": run_policy_episodes(hold_pose_policy(space), env, episodes, seed),
            "random": run_policy_episodes(random_policy(space, seed), env, episodes, seed),
        }
    finally:
        env.close()
    for s in scores.values():
        for per_episode in ("returns", "lengths", "survivals"):
            s.pop(per_episode, None)
    folder.mkdir(parents=True, exist_ok=True)
    from raylab.metrics.rundir import write_json_atomic

    write_json_atomic(path, {"key": json.loads(key), "scores": scores})
    return scores


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
    if name is None or not (path / MODULE_SUBDIR).is_dir():
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

    from raylab.quiet import quiet_logs

    quiet_logs()  # RLlib's deprecation notices while it rebuilds the module
    try:
        return RLModule.from_checkpoint(str((path / MODULE_SUBDIR).resolve()))
    except Exception as e:  # corrupt state files
        raise UserError(f"cannot load the policy in '{path}': {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------- video


def _video_env(cfg):
    """The task's single (reference) env with the run's options, for rendering."""
    import gymnasium as gym

    import raylab.envs  # noqa: F401
    from raylab.algorithms.build import env_options

    kwargs = env_options(cfg)
    for k in ("num_threads", "allow_overcommit", "autoreset_mode", "info_mode"):
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
                f"offscreen rendering is unavailable (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}): {e}; "
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
    elif checkpoint == "best":
        ckpt = best_checkpoint(run)
        if not ckpt.is_dir():
            raise UserError(
                f"no best checkpoint in '{ckpt.parent}': the run evaluated nothing "
                "(training.eval_every=0 and training.eval_before_train=false)"
            )
    else:
        ckpt = Path(checkpoint)
    check_checkpoint(ckpt, cfg.algo.name)
    module = load_policy(ckpt)
    from raylab.envs.backend import usable_cores

    env = make_eval_env(cfg, min(episodes, MAX_EVAL_ENVS), num_threads=usable_cores())
    print(f"raylab: evaluating {ckpt} on {cfg.task}, {episodes} episodes", file=sys.stderr)
    try:
        policy = deterministic_policy(module, env.single_action_space)
        stats = run_policy_episodes(policy, env, episodes, seed)
    finally:
        env.close()
    stats.update({"checkpoint": str(ckpt), "task": cfg.task, "algo": cfg.algo.name})
    video_path = run / "play_video.mp4" if video else None
    if video_path is not None:
        stats["video"] = str(video_path)
        stats["video_frames"] = render_episode(policy, cfg, seed, video_path)
        _upload_video(cfg, run, video_path)
    (run / "eval.json").write_text(json.dumps(stats, indent=2))
    print(eval_line(stats))
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
