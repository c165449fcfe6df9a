"""Term functions every robot task can use: ``f(env) -> one value (or one row) per env``.

They read the state arrays that :class:`~raylab.envs.core.vec_env.BatchedVecEnv` and its tasks
keep, one row per env: ``joint_vel``, ``action``, ``prev_action``, ``lin_vel``,
``trunk_height``, ``upright_cos``, ``step_count`` and ``episode_steps``. A task's own terms sit
in its task module next to its tables.

Arithmetic note (the reference envs must equal the batched ones bit for bit): a reduction over
a term's channels runs along the last axis of a C-contiguous (N, k) array, which numpy sums
with the same pairwise tree for any N, so a one-row state gives the bits of row i of N.
"""

from __future__ import annotations

import numpy as np


def mean_square(x: np.ndarray) -> np.ndarray:
    """Row mean of x*x of an (N, k) array."""
    return np.mean(np.ascontiguousarray(x * x), axis=1)


# -- rewards -----------------------------------------------------------------------------------


def upright(env):
    """Cosine of the trunk's tilt, floored at 0."""
    return np.maximum(0.0, env.upright_cos)


# -- observations ------------------------------------------------------------------------------


def obs_joint_vel(env):
    return env.joint_vel


def obs_action(env):
    """The action taken on the last step."""
    return env.action


def obs_base_lin_vel(env):
    """Trunk-frame linear velocity (m/s): privileged, what a policy must infer from IMU and
    joints."""
    return env.lin_vel


def obs_base_height(env):
    """Trunk height above the floor (m): privileged."""
    return env.trunk_height[:, None]


# -- terminations ------------------------------------------------------------------------------


def time_out(env):
    """The episode has run its ``episode_steps`` (a truncation: the learner bootstraps)."""
    return env.step_count >= env.episode_steps
