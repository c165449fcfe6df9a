"""docs/envs.md's recipe, followed: the example task of tests/example_task.py (one module) is a
Gymnasium vector env and env, a raylab task with typed options and reward weights, and real
RLlib EnvRunners sample it and log its reward terms."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from raylab.algorithms.build import build_algorithm_config, use_fast_sampler
from raylab.algorithms.env_runner import RaylabFastEnvRunner
from raylab.config import compose, to_dict
from raylab.envs.core.managers import reward_tag, termination_tag
from raylab.envs.tasks import TASKS
from raylab.errors import UserError
from raylab.metrics.tracker import drop_counts, merge_exports

GYM_ID = "raylab/MicroduckCrouch-v0"


@pytest.fixture(scope="module", autouse=True)
def example_task():
    """Import (so register) the example task for this module's tests only: the task table is
    global, and other tests list its names."""
    import example_task  # noqa: F401

    yield
    TASKS.pop("microduck_crouch")
    gym.registry.pop(GYM_ID)
    sys.modules.pop("example_task")


def test_the_example_is_a_vector_env_whose_reward_is_its_weighted_terms():
    vec = gym.make_vec(
        GYM_ID, num_envs=3, vectorization_mode="vector_entry_point", info_mode="full"
    )
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, 45) and obs.dtype == np.float32
    crouch = np.zeros((3, 14))
    crouch[:, [2, 11]], crouch[:, [3, 12]], crouch[:, [4, 13]] = 0.5, -1.0, 0.5  # bend the legs
    heights = []
    for _ in range(100):
        obs, rew, term, trunc, info = vec.step(crouch)
        np.testing.assert_array_equal(sum(info["reward_terms"].values()), rew)
        heights.append(info["reward_terms"]["height"].mean())
    assert trunc.all() and not term.any()  # 100 steps, standing: the time-out truncates
    assert heights[-1] > heights[0]  # bending the legs brings the trunk toward the target
    log = vec.unwrapped.pop_log()
    assert set(log) == {reward_tag(t) for t in ("height", "upright", "action_rate")} | {
        termination_tag("fallen"),
        termination_tag("time_out"),
    }
    assert log[termination_tag("time_out")] == 3
    vec.close()

    one = gym.make(GYM_ID, rew_upright=0.0)  # the single env, and a weight at 0 drops its term
    one.reset(seed=0)
    _, r, *_, info = one.step(np.zeros(14))
    assert set(info["reward_terms"]) == {"height", "action_rate"}
    assert r == pytest.approx(sum(info["reward_terms"].values()))
    one.close()


def test_the_example_is_a_raylab_task_with_checked_options():
    assert TASKS["microduck_crouch"].gym_id == GYM_ID
    cfg = to_dict(compose("ppo", "microduck_crouch", overrides=["env.rew_height=2.5"]))
    assert cfg["env"]["rew_height"] == 2.5 and cfg["env"]["target_height"] == 0.10
    # The options dataclass's check() runs when the config is composed, before any Ray.
    with pytest.raises(UserError, match="env: target_height=0.3 is invalid; valid range: 0.05"):
        compose("ppo", "microduck_crouch", overrides=["env.target_height=0.3"])
    with pytest.raises(UserError, match="rew_heigth"):
        compose("ppo", "microduck_crouch", overrides=["env.rew_heigth=1"])


def test_rllibs_env_runner_samples_the_example_and_logs_its_terms():
    cfg = compose("ppo", "microduck_crouch", overrides=["env.num_envs=4", "env.episode_steps=20"])
    assert use_fast_sampler(cfg)  # a raylab task: raylab's batched rollout loop
    config = build_algorithm_config(cfg).env_runners(rollout_fragment_length=25)
    runner = RaylabFastEnvRunner(config=config, worker_index=1)
    torch.manual_seed(0)
    episodes = runner.sample(num_timesteps=4 * 25)
    assert sum(len(e) for e in episodes) == 100
    assert sum(e.is_done for e in episodes) >= 4  # every env finished its 20-step episode
    metrics = runner.get_metrics()
    assert metrics["episode_len_mean"].peek() <= 20
    # The task's reward terms and termination counts travel with the collector's statistics
    # (what the driver logs as reward/<term> and Episode_Termination/<term>).
    merged = drop_counts(merge_exports(metrics["raylab"]["collector"].peek()))
    for tag in (reward_tag("height"), reward_tag("upright"), reward_tag("action_rate")):
        assert np.isfinite(merged[f"collector/{tag}"]), tag
    assert merged[f"collector/{termination_tag('time_out')}"] >= 4
    runner.stop()
