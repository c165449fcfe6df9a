"""algo.normalize_obs: running observation statistics inside the PPO / APPO module
(algorithms/modules.py, RunningObsNorm), updated by the Learner, carried with the weights into
the EnvRunners and the checkpoints, untouched by evaluation. algo.scale_rewards: the learner
trains on rewards divided by the running std of the discounted return
(algorithms/reward_scaling.py); reported returns stay the task's. algo.final_max_log_std: the
log-std bound the Learner moves with the env steps, carried the same way."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from raylab.algorithms.modules import OBS_CLIP, RunningObsNorm


def test_running_statistics_equal_those_of_every_valid_row_seen():
    rng = np.random.default_rng(0)
    norm = RunningObsNorm(3)
    seen = []
    for n in (5, 17, 1, 40):
        x = rng.normal([1.0, -20.0, 300.0], [0.5, 4.0, 50.0], size=(n, 3))
        mask = rng.random(n) < 0.7
        norm.update(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(mask))
        seen.append(x.astype(np.float32)[mask])
    rows = np.concatenate(seen).astype(np.float64)
    assert norm.count.item() == len(rows)
    np.testing.assert_allclose(norm.mean.numpy(), rows.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), rows.var(0), rtol=1e-9)
    out = norm(torch.as_tensor(rows, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(0), 1.0, atol=1e-4)
    far = norm(torch.tensor([[1e6, -1e6, 300.0]]))
    assert far[0, 0] == OBS_CLIP and far[0, 1] == -OBS_CLIP


def test_the_normalisation_follows_every_change_of_its_statistics():
    """The float32 statistics are kept between calls (an EnvRunner normalises every step) and
    rebuilt whenever the buffers change: a merge, a commit, a weight sync (load_state_dict);
    what inference mode computed never enters autograd."""

    def expected(norm, x):
        mean, var = norm.mean.to(torch.float32), norm.var.to(torch.float32)
        return torch.clamp((x - mean) / torch.sqrt(var + norm.eps), -OBS_CLIP, OBS_CLIP)

    rng = np.random.default_rng(2)
    x = torch.as_tensor(rng.normal(1.0, 3.0, size=(8, 2)), dtype=torch.float32)
    norm = RunningObsNorm(2)
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), expected(norm, x), rtol=0, atol=0)
    norm.update(torch.as_tensor(rng.normal(5.0, 2.0, size=(50, 2)), dtype=torch.float32))
    torch.testing.assert_close(norm(x), expected(norm, x), rtol=0, atol=0)
    norm.collect(torch.as_tensor(rng.normal(-4.0, 1.0, size=(30, 2)), dtype=torch.float32))
    norm.commit()
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), expected(norm, x), rtol=0, atol=0)
    synced = RunningObsNorm(2)
    synced.update(torch.as_tensor(rng.normal(9.0, 0.5, size=(20, 2)), dtype=torch.float32))
    norm.load_state_dict(synced.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), expected(synced, x), rtol=0, atol=0)
    layer = torch.nn.Linear(2, 1)
    layer(norm(x)).sum().backward()  # after an inference-mode call, in autograd
    assert layer.weight.grad is not None
    torch.testing.assert_close(norm(x), expected(synced, x), rtol=0, atol=0)


def test_an_update_is_normalised_with_the_statistics_it_was_sampled_with():
    """The Learner collects each minibatch's rows and commits them after the whole update: the
    normalisation is the EnvRunners' until then, and the commit gives the statistics of every
    row, as if they had been merged one batch at a time."""
    rng = np.random.default_rng(1)
    first = torch.as_tensor(rng.normal(0.0, 1.0, size=(10, 3)), dtype=torch.float32)
    batches = [rng.normal([3.0, -2.0, 50.0], [1.0, 2.0, 9.0], size=(64, 3)) for _ in range(5)]
    masks = [rng.random(64) < 0.8 for _ in batches]
    norm, reference = RunningObsNorm(3), RunningObsNorm(3)
    norm.update(first)
    reference.update(first)
    probe = torch.as_tensor(batches[0], dtype=torch.float32)
    sampled_with = norm(probe)
    for x, m in zip(batches, masks):
        norm.collect(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(m))
        torch.testing.assert_close(norm(probe), sampled_with, rtol=0, atol=0)  # unchanged
        reference.update(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(m))
    norm.commit()
    assert norm.count.item() == reference.count.item() == 10 + sum(int(m.sum()) for m in masks)
    np.testing.assert_allclose(norm.mean.numpy(), reference.mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), reference.var.numpy(), rtol=1e-9)
    assert not torch.equal(norm(probe), sampled_with)
    norm.commit()  # nothing pending: no change
    assert norm.count.item() == reference.count.item()


def _on_learners(algo, fn):
    return [r.get() if hasattr(r, "get") else r for r in algo.learner_group.foreach_learner(fn)]


def _actions(module, obs):
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        return module.forward_inference({Columns.OBS: torch.as_tensor(obs)})[
            Columns.ACTION_DIST_INPUTS
        ].numpy()


def _train(algo_name: str, path):
    """One real Algorithm in this process (the test process's Ray) with four options on:
    observation normalisation, reward scaling, the linear learning-rate schedule (to 0 at
    8,192 env steps) and the log-std bound's schedule (from 1 to -2 over the same steps).
    Trained until its Learner has taken in at least 4,096 observations, then its statistics
    are read on the Learner and (after a sync) on the EnvRunner, once more after an
    evaluation, and it is checkpointed. One run serves every test of its algorithm below."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose
    from raylab.reporting import env_steps
    from raylab.train import algorithm_class

    overrides = [
        "algo.normalize_obs=true",
        "algo.scale_rewards=true",
        "algo.lr_schedule=linear",
        "algo.lr=0.001",
        "algo.max_log_std=1.0",
        "algo.final_max_log_std=-2.0",
        "training.total_steps=8192",
        "training.time_budget_s=null",  # the bound's schedule by env steps alone
        "resources.num_env_runners=1",
        "env.num_envs=4",
        "algo.hidden=[32,32]",
        "training.iteration_s=0",
        "training.eval_every=2",
        "training.eval_episodes=2",
        "training.eval_before_train=false",
        "training.eval_background=false",  # the test calls evaluate() itself
    ]
    if algo_name == "ppo":
        overrides += ["algo.train_batch_size=1024", "algo.minibatch_size=256", "algo.num_epochs=1"]
    else:
        overrides += ["algo.train_batch_size=256"]
    cfg = compose(algo_name, "Pendulum-v1", "mujoco", overrides)
    algo = algorithm_class(algo_name)(config=build_algorithm_config(cfg))

    def stats(module):
        n = module.obs_norm
        return n.count.item(), n.mean.numpy().copy(), n.var.numpy().copy()

    def learner_state(lr):
        module = lr.module["default_policy"]
        optimizer = lr.get_optimizers_for_module("default_policy")[0][1]
        return {
            "obs": stats(module),
            "returns": (module.return_norm.count.item(), float(module.return_norm.var[0].sqrt())),
            "lr": optimizer.param_groups[0]["lr"],
            "bound": float(module.log_std_bound),
        }

    out = {}
    try:
        for _ in range(60):
            result = algo.train()
            (learner,) = _on_learners(algo, learner_state)
            if learner["obs"][0] >= 4096:
                break
        # APPO's Learner may still be updating on batches that train() queued; no more come, so
        # wait until its state stops changing, or the checkpoint below holds a later state.
        for _ in range(60):
            time.sleep(0.5)
            (settled,) = _on_learners(algo, learner_state)
            if settled["obs"][0] == learner["obs"][0] and settled["bound"] == learner["bound"]:
                break
            learner = settled
        out["result"], out["learner"], out["sampled"] = result, learner, env_steps(result)
        algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group)
        (out["runner"],) = algo.env_runner_group.foreach_env_runner(
            lambda r: stats(r.module), local_env_runner=False
        )
        (out["runner_bound"],) = algo.env_runner_group.foreach_env_runner(
            lambda r: float(r.module.log_std_bound), local_env_runner=False
        )
        algo.evaluate()  # it only reads the statistics
        (out["runner_after_eval"],) = algo.env_runner_group.foreach_env_runner(
            lambda r: stats(r.module), local_env_runner=False
        )
        out["checkpoint"] = algo.save_to_path(str(path / "ckpt"))
        obs = np.random.default_rng(1).normal([0, 0, 0], [1, 1, 6], size=(16, 3))
        out["obs"] = obs.astype(np.float32)
        out["actions"] = _actions(algo.get_module("default_policy"), out["obs"])
    finally:
        algo.stop()
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _in_process_ray):
    runs = {}

    def get(algo_name: str):
        if algo_name not in runs:
            _in_process_ray.ensure()  # the test process's Ray (conftest.py)
            runs[algo_name] = _train(algo_name, tmp_path_factory.mktemp(algo_name))
        return runs[algo_name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("algo_name", ["ppo", "appo"])
def test_statistics_travel_with_the_weights_and_the_checkpoint(algo_name, trained):
    """After training, the EnvRunner's module holds the Learner's statistics, an evaluation
    leaves them as they are, and the policy restored from a checkpoint (as `raylab eval` loads
    it) acts exactly as the trained one, which differs from the same weights without the
    normalisation."""
    from pathlib import Path

    from raylab.evaluate import load_policy

    run = trained(algo_name)
    count, mean, var = run["learner"]["obs"]
    assert count >= 4096
    # Pendulum's observation: cos, sin (in [-1, 1]) and the angular velocity (in [-8, 8]).
    assert np.all(np.abs(mean[:2]) <= 1.0) and var[2] > var[0] and var[2] > 0.1
    # The statistics the EnvRunners act with are the Learner's own (RLlib hands module state
    # on as float32; the normalisation computes in float32).
    runner = run["runner"]
    assert runner[0] == count
    np.testing.assert_array_equal(runner[1], mean.astype(np.float32))
    np.testing.assert_array_equal(runner[2], var.astype(np.float32))
    assert run["runner_after_eval"][0] == count
    np.testing.assert_array_equal(run["runner_after_eval"][1], runner[1])

    restored = load_policy(Path(run["checkpoint"]))
    assert restored.obs_norm.count.item() == count
    np.testing.assert_array_equal(_actions(restored, run["obs"]), run["actions"])
    restored.obs_norm = None  # the same weights without the normalisation act otherwise
    assert not np.allclose(_actions(restored, run["obs"]), run["actions"])


@pytest.mark.slow
@pytest.mark.parametrize("algo_name", ["ppo", "appo"])
def test_the_log_std_bound_follows_its_schedule_into_runners_and_checkpoints(algo_name, trained):
    """algo.final_max_log_std=-2 from max_log_std=1 over 8,192 env steps: the Learner's bound
    is where the schedule puts it after the env steps it was told of (PPO: those of this
    iteration; APPO's asynchronous Learner may be a batch behind), the EnvRunner acts with the
    same bound, the restored checkpoint keeps it, and no log std exceeds it."""
    from pathlib import Path

    from raylab.algorithms.modules import scheduled_log_std_bound
    from raylab.evaluate import load_policy

    run = trained(algo_name)
    bound = run["learner"]["bound"]
    expected = scheduled_log_std_bound(1.0, -2.0, 8192, run["sampled"])
    assert run["sampled"] >= 2048 and expected <= 0.25  # at least a quarter of the way down
    if algo_name == "ppo":
        assert bound == pytest.approx(expected, abs=1e-6)
    else:
        assert expected - 1e-6 <= bound < 1.0 - 1e-3
    assert run["runner_bound"] == bound
    restored = load_policy(Path(run["checkpoint"]))
    assert float(restored.log_std_bound) == bound
    log_std = np.split(_actions(restored, run["obs"]), 2, axis=-1)[1]
    assert np.all(log_std < bound)


@pytest.mark.slow
def test_ppo_learns_from_scaled_rewards_and_reports_the_tasks_returns(trained):
    """With algo.scale_rewards the Learner's value targets are on the scaled rewards' scale (a
    few units, where Pendulum's returns are about -1,000), while Train/mean_reward stays in the
    task's units."""
    from raylab.metrics import schema as S

    run = trained("ppo")
    count, std = run["learner"]["returns"]
    assert count >= 4096
    assert std > 10.0  # Pendulum's discounted returns spread over tens to hundreds
    assert run["result"][S.TRAIN_MEAN_REWARD] < -300.0  # the task's own units (untrained)
    target = _learner_stat(run["result"], "value_target")
    assert target is not None and abs(target) < 50.0, target


@pytest.mark.slow
def test_linear_lr_schedule_brings_the_learning_rate_down_with_the_env_steps(trained):
    """algo.lr_schedule=linear: from 1e-3 to 0 at 8,192 env steps sampled (RLlib sets the
    optimizer's rate after each update)."""
    run = trained("ppo")
    assert 4096 <= run["sampled"] < 8192
    assert 0.0 < run["learner"]["lr"] < 0.001 * (1 - 3000 / 8192), run["learner"]["lr"]


def _episode(rewards, terminated=False, id_=None):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    n = len(rewards)
    ep = SingleAgentEpisode(
        id_=id_,
        observations=[np.zeros(1, np.float32)] * (n + 1),
        actions=[np.zeros(1, np.float32)] * n,
        rewards=list(rewards),
        terminated=terminated,
        len_lookback_buffer=0,
    )
    return ep.to_numpy()


def test_rewards_are_scaled_by_the_std_of_the_running_discounted_return():
    """Chunks of one episode continue its discounted return; a new episode starts from 0; the
    scale is that of every return seen so far, and the module keeps the statistics."""
    from types import SimpleNamespace

    from ray.rllib.core import DEFAULT_MODULE_ID

    from raylab.algorithms.reward_scaling import ScaleRewardsByReturnStd

    gamma = 0.9
    module = SimpleNamespace(return_norm=RunningObsNorm(1))
    piece = ScaleRewardsByReturnStd(gamma=gamma)
    first = _episode([1.0, 2.0, 3.0], id_="a")  # its episode goes on in the next batch
    other = _episode([5.0, -1.0], terminated=True, id_="b")
    piece(rl_module={DEFAULT_MODULE_ID: module}, batch={}, episodes=[first, other])
    rest = _episode([4.0, 0.5], terminated=True, id_="a")
    fresh = _episode([2.0], id_="c")
    piece(rl_module={DEFAULT_MODULE_ID: module}, batch={}, episodes=[rest, fresh])

    def running(rs, g=0.0):
        out = []
        for r in rs:
            g = gamma * g + r
            out.append(g)
        return out

    a = running([1.0, 2.0, 3.0])
    batch1 = a + running([5.0, -1.0])
    batch2 = running([4.0, 0.5], a[-1]) + running([2.0])
    std1 = np.sqrt(np.var(batch1) + 1e-8)
    std2 = np.sqrt(np.var(batch1 + batch2) + 1e-8)
    np.testing.assert_allclose(first.get_rewards(), np.array([1.0, 2.0, 3.0]) / std1, rtol=1e-6)
    np.testing.assert_allclose(other.get_rewards(), np.array([5.0, -1.0]) / std1, rtol=1e-6)
    np.testing.assert_allclose(rest.get_rewards(), np.array([4.0, 0.5]) / std2, rtol=1e-6)
    np.testing.assert_allclose(fresh.get_rewards(), np.array([2.0]) / std2, rtol=1e-6)
    assert module.return_norm.count.item() == 8
    assert "a" not in piece._open and "b" not in piece._open and "c" in piece._open


def _learner_stat(result, name):
    """A learner statistic as the run reports it (Policy/<name>, raylab's canonical tag)."""
    from raylab.metrics import schema as S
    from raylab.reporting import canonical_metrics

    return canonical_metrics(result).get(S.policy_tag(name))
