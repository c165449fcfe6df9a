"""RaylabPPOLearner's own minibatch loop (algorithms/learners.py): the same update as RLlib's
Learner loop, without its per-minibatch bookkeeping.

The equivalence test trains one real Learner (a PPO Algorithm in the test process's Ray, its
Learner local) twice from the same state on the same sampled episodes: once with raylab's loop,
once with RLlib's (the loop switched off on that Learner), without shuffling so that both see
the same minibatches. The weights and the reported statistics must agree.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from raylab.algorithms.learners import minibatch_indices, update_threads


def test_minibatches_cover_every_row_once_per_epoch():
    chunks = minibatch_indices(512, 64, num_epochs=3, shuffle=True, rng=np.random.default_rng(0))
    assert len(chunks) == 24 and all(len(c) == 64 for c in chunks)
    for epoch in range(3):
        rows = np.concatenate(chunks[8 * epoch : 8 * (epoch + 1)])
        assert sorted(rows) == list(range(512))  # each epoch a permutation of all rows
    assert not np.array_equal(np.concatenate(chunks[:8]), np.arange(512))  # shuffled
    assert not np.array_equal(np.concatenate(chunks[:8]), np.concatenate(chunks[8:16]))


def test_minibatches_cycle_across_an_epoch_s_end_as_rllib_s_do():
    # 258 rows, 3 epochs of 64: ceil(774 / 64) = 13 minibatches; the last one runs into a
    # fourth pass over the rows, as RLlib's cyclic iterator does.
    chunks = minibatch_indices(258, 64, num_epochs=3, shuffle=False)
    assert len(chunks) == 13 and all(len(c) == 64 for c in chunks)
    stream = np.concatenate(chunks)
    np.testing.assert_array_equal(stream, np.tile(np.arange(258), 4)[: 13 * 64])
    # Several Learners ask for a number of minibatches instead (equal steps on every rank).
    assert len(minibatch_indices(258, 64, num_epochs=3, num_total_minibatches=20)) == 20
    # No minibatch size: the whole batch per step, once per epoch.
    whole = minibatch_indices(100, None, num_epochs=2, shuffle=False)
    assert len(whole) == 2 and all(len(c) == 100 for c in whole)


def _flat(result, prefix=""):
    for key, value in result.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", getattr(value, "peek", lambda v=value: v)()


@pytest.mark.slow
def test_raylab_s_minibatch_loop_updates_as_rllib_s_does(ray_in_process):
    """Global-norm clipping that bites (0.05), a KL penalty and observation normalisation on:
    three epochs of 64-row minibatches over 258 rows (the last minibatch crosses into a fourth
    pass). Equal weights, equal loss statistics and step counts; the observation statistics
    count each sampled observation once (RLlib's loop collected each row once per minibatch
    it appeared in)."""
    import torch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose
    from raylab.train import algorithm_class

    overrides = [
        "algo.hidden=[16]",
        "algo.normalize_obs=true",
        "algo.grad_clip=0.05",
        "algo.kl_coeff=0.3",
        "env.num_envs=2",
        "resources.num_env_runners=1",
        "training.eval_every=0",
        "training.eval_before_train=false",
    ]
    cfg = compose("ppo", "Pendulum-v1", "mujoco", overrides)
    algo = algorithm_class("ppo")(config=build_algorithm_config(cfg).learners(num_learners=0))
    try:
        (episodes,) = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.sample(num_timesteps=256), local_env_runner=False
        )
        learner = algo.learner_group._learner
        initial = copy.deepcopy(learner.get_state())
        own_loop = learner._own_loop_covers
        kl_coeff = learner.curr_kl_coeffs_per_module["default_policy"]
        initial_kl_coeff = float(kl_coeff)

        def update(own: bool):
            learner.set_state(copy.deepcopy(initial))
            kl_coeff.data.fill_(initial_kl_coeff)  # adapted after each update; not in the state
            learner._own_loop_covers = own_loop if own else (lambda: False)
            result = learner.update(
                episodes=copy.deepcopy(episodes),  # the learner connector extends them
                num_epochs=3,
                minibatch_size=64,
                shuffle_batch_per_epoch=False,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 256},
            )
            module = learner.module["default_policy"]
            weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
            return weights, dict(_flat(result))

        learner.set_state(copy.deepcopy(initial))
        start = {
            k: v.detach().clone() for k, v in learner.module["default_policy"].state_dict().items()
        }
        ours, ours_result = update(True)
        theirs, theirs_result = update(False)
    finally:
        algo.stop()
    params = [k for k in ours if not k.startswith(("obs_norm.", "return_norm."))]
    for key in params:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=key)
    moved = max(float((ours[k] - start[k]).abs().max()) for k in params)
    assert moved > 1e-3, "the update did not move the weights"
    for key in ("return_norm.count", "return_norm.mean", "return_norm.var"):
        torch.testing.assert_close(ours[key], theirs[key], msg=key)
    assert float(ours["obs_norm.count"]) == 256  # each sampled observation once
    # RLlib's: every row of every minibatch; two envs x 128 steps make two episodes, each with
    # one masked bootstrap row, so three full passes hold 6 masked rows and the part of the
    # fourth (rows 0-57) none.
    assert float(theirs["obs_norm.count"]) == 13 * 64 - 6

    for name in (
        "policy_loss",
        "vf_loss",
        "vf_loss_unclipped",
        "vf_explained_var",
        "entropy",
        "mean_kl_loss",
        "total_loss",
        "gradients_default_optimizer_global_norm",
    ):
        key = f"default_policy/{name}"
        assert key in ours_result and key in theirs_result, key
        np.testing.assert_allclose(
            float(ours_result[key]), float(theirs_result[key]), rtol=1e-4, atol=1e-6, err_msg=key
        )
    assert float(ours_result["default_policy/mean_kl_loss"]) > 0.0
    for name in (
        "default_policy/num_module_steps_trained",
        "__all_modules__/num_module_steps_trained_lifetime",
        "__all_modules__/num_env_steps_trained",
        "default_policy/module_train_batch_size_mean",
    ):
        assert ours_result[name] == theirs_result[name], name
    assert ours_result["default_policy/num_module_steps_trained"] == 13 * 64


def test_the_update_runs_on_the_machine_s_cores_unless_told(monkeypatch):
    """algo.learner_threads: PPO's update (which never overlaps sampling) runs on every core of
    its machine with one Learner and minibatches of 512 rows or more, on one thread with
    smaller minibatches (where a second thread costs more than it splits), on the number given
    otherwise (at most the cores); the Learner's thread count outside the update is left as it
    was."""
    import os

    import gymnasium as gym
    import torch

    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    env = gym.make("Pendulum-v1")
    spaces = {"__env__": (env.observation_space, env.action_space)}
    spaces["default_policy"] = spaces["__env__"]
    env.close()
    cores = len(os.sched_getaffinity(0))
    for extra, expected in (
        ([], 1),  # the Gymnasium ids' 64-row minibatches: one thread is faster
        (["algo.minibatch_size=512"], cores),
        (["algo.learner_threads=1", "algo.minibatch_size=512"], 1),
        (["algo.learner_threads=2"], min(2, cores)),
        (["algo.learner_threads=64"], cores),
    ):
        cfg = compose("ppo", "Pendulum-v1", "mujoco", ["algo.hidden=[16]"] + extra)
        learner = build_algorithm_config(cfg).build_learner(spaces=spaces)
        learner.build()
        assert learner._update_threads == expected, extra
    assert update_threads(None, num_learners=2, cores=8) == 1  # Learners sharing a machine
    assert update_threads(None, num_learners=0, cores=8) == 8  # learning in the algorithm actor
    assert update_threads(None, num_learners=1, cores=8, minibatch_size=1024) == 8
    assert update_threads(None, num_learners=1, cores=8, minibatch_size=64) == 1
    assert update_threads(3, num_learners=1, cores=8, minibatch_size=64) == 3  # asked for

    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

    seen = []  # RLlib's update, under raylab's: the thread count it runs with
    monkeypatch.setattr(
        PPOTorchLearner, "update", lambda self, *a, **k: seen.append(torch.get_num_threads())
    )
    before = torch.get_num_threads()
    learner._update_threads = 1 if before != 1 else 2
    learner.update(timesteps={})
    assert seen == [learner._update_threads] and torch.get_num_threads() == before
