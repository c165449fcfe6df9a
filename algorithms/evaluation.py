"""Policies run on fixed-seed episodes: the episode code of every evaluation.

The evaluation during training (:class:`~raylab.algorithms.env_runner.RaylabEvalEnvRunner`,
RLlib's evaluation EnvRunner), ``raylab eval``, the baselines the plots draw and the
track-error tool (all in :mod:`raylab.evaluate`) run their episodes with
:func:`run_policy_episodes`:

- episode ``k`` of an evaluation starts from ``reset(seed=seed + k)``, whatever the number of
  envs it runs on: rounds of ``num_envs`` episodes, each round a fresh seeded reset of the
  vector env (env ``i`` of a round seeded ``seed + first + i``), one episode per env;
- actions are the policy's deterministic ones (the mean of its Gaussian), in the env's units;
- survival is the task's own definition: the share of an episode's steps on which
  ``info["fallen"]`` is false (Microduck balance:
  :func:`raylab.envs.robots.microduck.is_fallen`), and 0 for an episode that
  terminated (a joystick robot that fell); tasks without ``fallen`` (Gymnasium ids) report
  none;
- joystick tasks also report tracking errors, |cmd_xy - v_xy| (m/s) and |cmd_yaw - yaw rate|
  (rad/s), averaged over the steps with a non-zero command (``_moving``), over all steps, and
  (linear) over the zero-command steps (``_still``); ``command_speed`` is the mean |cmd_xy| of
  the moving steps, the linear error of standing still there;
- tasks that push the robot on a schedule (Microduck balance: ``info["episode_params"]`` of the
  reset names each push's step and velocity) also report the push table: per push speed (bins
  of ``PUSH_BIN`` m/s), the pushes that hit a standing robot and how many of them felled it;
  an episode's first fall is blamed on the last push before it (one that fell unpushed counts
  in ``fell_unpushed``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import numpy as np

# Envs stepped at once by an evaluation (fewer when it runs fewer episodes).
MAX_EVAL_ENVS = 100
PUSH_BIN = 0.05  # m/s: the push table's bin width

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


def sampled_policy(module, action_space, seed: int = 0) -> Policy:
    """An RLModule's actions drawn from its action distribution, as it acts in training (torch
    generator seeded ``seed``), unsquashed into ``action_space`` and clipped to it."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    gen = torch.Generator().manual_seed(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module.forward_inference({Columns.OBS: torch.as_tensor(obs, dtype=torch.float32)})
            mean, log_std = out[Columns.ACTION_DIST_INPUTS].chunk(2, dim=-1)
            action = (mean + log_std.exp() * torch.randn(mean.shape, generator=gen)).numpy()
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
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **options
    )


def run_policy_episodes(policy: Policy, env, episodes: int, seed: int) -> Dict[str, Any]:
    """Run ``episodes`` episodes of ``policy`` on the vector ``env`` (the module docstring has
    the seeding, survival and tracking-error rules) and return their statistics."""
    n = int(env.num_envs)
    returns, lengths, survival = [], [], []
    has_fallen = tracks = False
    err = {k: 0.0 for k in ("lin", "yaw", "lin_m", "yaw_m", "lin_s", "speed")}
    n_all = n_moving = 0
    pushes: List[tuple] = []  # (speed, felled) of each push that hit a standing robot
    fell_unpushed, pushed_task = 0, False
    for first in range(0, episodes, n):
        m = min(n, episodes - first)
        obs, reset_info = env.reset(seed=seed + first)
        schedules = _push_schedules(reset_info, m)
        pushed_task |= schedules is not None
        first_fall = np.full(n, -1, dtype=np.int64)  # steps taken when the robot was first down
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
                down = np.asarray(info["fallen"], dtype=bool)
                alive[r] += ~down[r]
                new = r & down & (first_fall < 0)
                first_fall[new] = length[new]
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
                err["lin_s"] += e_lin[~moving].sum()
                err["speed"] += np.linalg.norm(cmd[moving, :2], axis=1).sum()
                n_all += int(r.sum())
                n_moving += int(moving.sum())
            terminated |= r & np.asarray(term, dtype=bool)
            running &= ~(np.asarray(term, dtype=bool) | np.asarray(trunc, dtype=bool))
        if schedules is not None:
            for i, (steps, speeds) in enumerate(schedules):
                fell = int(first_fall[i])
                # A push at step s lands before the physics of step s + 1 (s steps taken).
                hit = [(s, v) for s, v in zip(steps, speeds) if fell < 0 or s < fell]
                blamed = max(hit)[0] if fell >= 0 and hit else None
                fell_unpushed += int(fell >= 0 and not hit)
                pushes += [(v, s == blamed) for s, v in hit]
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
    if pushed_task:
        out["push_table"] = push_table(pushes)
        out["fell_unpushed"] = fell_unpushed
    if tracks:

        def mean(total: float, count: int) -> Optional[float]:
            return float(total / count) if count else None

        out.update(
            lin_vel_error_moving=mean(err["lin_m"], n_moving),
            yaw_rate_error_moving=mean(err["yaw_m"], n_moving),
            lin_vel_error=mean(err["lin"], n_all),
            yaw_rate_error=mean(err["yaw"], n_all),
            lin_vel_error_still=mean(err["lin_s"], n_all - n_moving),
            command_speed=mean(err["speed"], n_moving),
        )
    return out


def _push_schedules(reset_info: Dict[str, Any], m: int):
    """[(push steps, push speeds)] of the first ``m`` envs from a reset's full info, or None
    for a task without scheduled pushes."""
    params = reset_info.get("episode_params") if isinstance(reset_info, dict) else None
    if params is None or not hasattr(params[0], "push_steps"):
        return None
    return [
        (
            [int(s) for s in params[i].push_steps],
            [float(v) for v in np.linalg.norm(np.asarray(params[i].push_vel), axis=1)],
        )
        for i in range(m)
    ]


def push_table(pushes) -> List[Dict[str, Any]]:
    """Rows ``{"speed": [low, high], "pushes": n, "felled": k}`` of the pushes that hit a
    standing robot, binned by speed (``PUSH_BIN``)."""
    rows: Dict[int, List[int]] = {}
    for speed, felled in pushes:
        row = rows.setdefault(int(np.floor(speed / PUSH_BIN + 1e-9)), [0, 0])
        row[0] += 1
        row[1] += int(felled)
    return [
        {
            "speed": [round(b * PUSH_BIN, 3), round((b + 1) * PUSH_BIN, 3)],
            "pushes": n,
            "felled": k,
        }
        for b, (n, k) in sorted(rows.items())
    ]
