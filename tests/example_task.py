"""microduck_crouch: the example task of docs/envs.md's recipe, one module, used by its test.

The duck starts standing and must lower its trunk to ``target_height`` and stay upright there;
it falls when tilted past 60 degrees. Everything of the task is below: options with the reward
weights, terms, tables, the vector env, the single env and the task-table entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raylab.envs import register
from raylab.envs.core.managers import EventTerm, ObsTerm, TerminationTerm, reward_table
from raylab.envs.core.options import parse_options
from raylab.envs.core.single_env import SingleEnv
from raylab.envs.core.terms import obs_action, obs_joint_vel, time_out, upright
from raylab.envs.core.vec_env import BatchedVecEnv
from raylab.envs.robots.microduck import N_SUBSTEPS, NUM_ACTIONS, prototype, robot_index
from raylab.envs.tasks import BatchedEnvConfig, TaskSpec, option

# 1. Options: the task's knobs and its reward weights (rew_<term>), each with a help line.


@dataclass
class CrouchConfig(BatchedEnvConfig):
    episode_steps: int = option(100, "control steps per episode (50 Hz)")
    action_scale: float = option(0.35, "target = stand pose + action_scale * action")
    target_height: float = option(0.10, "trunk height to crouch to (m); the stand is 0.12")
    rew_height: float = option(1.0, "reward weight: Gaussian of the trunk height error")
    rew_upright: float = option(0.5, "reward weight: max(0, cosine of the trunk's tilt)")
    rew_action_rate: float = option(-0.05, "reward weight: mean square action change")

    def check(self) -> None:  # one line per bad value, naming it and the valid range
        if not 0.05 <= self.target_height <= 0.12:
            raise ValueError(
                f"target_height={self.target_height} is invalid; valid range: 0.05..0.12"
            )


# 2. Terms: f(env) -> one value (or one row) per env, from the env's state arrays.


def height(env):
    e = (env.trunk_height - env.opts.target_height) / 0.01
    return np.exp(-0.5 * e * e)


def action_rate(env):
    return np.mean(np.ascontiguousarray((env.action - env.prev_action) ** 2), axis=1)


def obs_joint_pos(env):
    return env.joint_pos - env.stand


def obs_gravity(env):
    return env.gravity


def fell(env):
    return env.upright_cos < 0.5


def reset_to_stand(env, env_ids):
    ctrl = np.zeros(env.sim.prototype.nu)
    ctrl[env.robot.act_ids] = env.stand
    for i in env_ids:
        env.sim.reset_env(i, env.robot.key_id, env.robot.stand_qpos, np.zeros(env.robot.nv), ctrl)
    env.step_count[env_ids] = 0
    env.action[env_ids] = env.prev_action[env_ids] = 0.0


# 3. Tables.

REWARD_TERMS = {"height": height, "upright": upright, "action_rate": action_rate}
OBSERVATIONS = (
    ObsTerm("joint_pos", obs_joint_pos, NUM_ACTIONS),
    ObsTerm("joint_vel", obs_joint_vel, NUM_ACTIONS, scale=0.05),
    ObsTerm("last_action", obs_action, NUM_ACTIONS),
    ObsTerm("projected_gravity", obs_gravity, 3),
)
TERMINATIONS = (
    TerminationTerm("fallen", fell),
    TerminationTerm("time_out", time_out, time_out=True),
)
EVENTS = (EventTerm("stand", reset_to_stand, mode="reset"),)


# 4. The vector env: options and model, state arrays and tables, actions to servo targets.


class CrouchVecEnv(BatchedVecEnv):
    def _configure(self, options):
        self.opts = parse_options(CrouchConfig, options)
        self.robot = robot_index("default")
        return prototype("default"), N_SUBSTEPS

    def _build(self):
        n = self.num_envs
        self.stand, self.episode_steps = self.robot.stand, self.opts.episode_steps
        self.action, self.prev_action = np.zeros((n, NUM_ACTIONS)), np.zeros((n, NUM_ACTIONS))
        self._init_managers(
            NUM_ACTIONS, OBSERVATIONS, (), reward_table(REWARD_TERMS, self.opts),
            TERMINATIONS, (), EVENTS,
        )  # fmt: skip

    def _apply_actions(self, actions, ids):
        self.prev_action[ids] = self.action[ids]
        self.action[ids] = actions[ids]
        target = self.stand + self.opts.action_scale * self.action
        self.ctrl[:, self.robot.act_ids] = np.clip(target, self.robot.lower, self.robot.upper)


class CrouchEnv(SingleEnv):
    vec_cls = CrouchVecEnv


# 5. The task table's entry (a shipped task: one TaskSpec in raylab/envs/tasks/__init__.py).

register(
    TaskSpec(
        name="microduck_crouch",
        gym_id="raylab/MicroduckCrouch-v0",
        entry_point=f"{__name__}:CrouchEnv",
        vector_entry_point=f"{__name__}:CrouchVecEnv",
        config=f"{__name__}:CrouchConfig",
        description="the recipe's example: crouch to a target height and stay upright",
    )
)
