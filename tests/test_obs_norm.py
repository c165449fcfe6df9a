"""algo.normalize_obs: running observation statistics inside the PPO / APPO module
(algorithms/modules.py, RunningObsNorm), updated by the Learner, carried with the weights into
the EnvRunners and the checkpoints, untouched by evaluation."""

from __future__ import annotations

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


def _on_learners(algo, fn):
    return [r.get() if hasattr(r, "get") else r for r in algo.learner_group.foreach_learner(fn)]


def _actions(module, obs):
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        return module.forward_inference({Columns.OBS: torch.as_tensor(obs)})[
            Columns.ACTION_DIST_INPUTS
        ].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("algo_name", ["ppo", "appo"])
def test_statistics_travel_with_the_weights_and_the_checkpoint(algo_name, tmp_path, ray_in_process):
    """A real Algorithm in this process (the test process's Ray): after training, the
    EnvRunner's module holds the Learner's statistics, an evaluation leaves them as they are,
    and the policy restored from a checkpoint (as `raylab eval` loads it) acts exactly as the
    trained one, which differs from the same weights without the normalisation."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose
    from raylab.evaluate import load_policy
    from raylab.train import algorithm_class

    overrides = [
        "algo.normalize_obs=true",
        "resources.num_env_runners=1",
        "env.num_envs=4",
        "algo.hidden=[32,32]",
        "training.iteration_s=0",
        "training.eval_every=2",
        "training.eval_episodes=2",
        "training.eval_before_train=false",
    ]
    if algo_name == "ppo":
        overrides += ["algo.train_batch_size=512", "algo.minibatch_size=128", "algo.num_epochs=2"]
    else:
        overrides += ["algo.train_batch_size=256"]
    cfg = compose(algo_name, "Pendulum-v1", "mujoco", overrides)
    algo = algorithm_class(algo_name)(config=build_algorithm_config(cfg))
    try:
        for _ in range(40):
            algo.train()
            (seen,) = _on_learners(
                algo, lambda lr: lr.module["default_policy"].obs_norm.count.item()
            )
            if seen >= 2048:
                break

        def stats(module):
            n = module.obs_norm
            return n.count.item(), n.mean.numpy().copy(), n.var.numpy().copy()

        ((count, mean, var),) = _on_learners(algo, lambda lr: stats(lr.module["default_policy"]))
        assert count >= 2048
        # Pendulum's observation: cos, sin (in [-1, 1]) and the angular velocity (in [-8, 8]).
        assert np.all(np.abs(mean[:2]) <= 1.0) and var[2] > var[0] and var[2] > 0.1
        # The weights and the statistics the EnvRunners act with are the Learner's own (RLlib
        # hands module state on as float32; the normalisation computes in float32).
        algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group)
        (runner,) = algo.env_runner_group.foreach_env_runner(
            lambda r: stats(r.module), local_env_runner=False
        )
        assert runner[0] == count
        np.testing.assert_array_equal(runner[1], mean.astype(np.float32))
        np.testing.assert_array_equal(runner[2], var.astype(np.float32))
        # Evaluation only reads them.
        algo.evaluate()
        (after,) = algo.env_runner_group.foreach_env_runner(
            lambda r: stats(r.module), local_env_runner=False
        )
        assert after[0] == count

        path = algo.save_to_path(str(tmp_path / "ckpt"))
        obs = np.random.default_rng(1).normal([0, 0, 0], [1, 1, 6], size=(16, 3))
        obs = obs.astype(np.float32)
        trained = algo.get_module("default_policy")
        before = _actions(trained, obs)
    finally:
        algo.stop()
    from pathlib import Path

    restored = load_policy(Path(path))
    assert restored.obs_norm.count.item() == count
    np.testing.assert_array_equal(_actions(restored, obs), before)
    restored.obs_norm = None  # the same weights without the normalisation act otherwise
    assert not np.allclose(_actions(restored, obs), before)
