"""``algo.lr_schedule=adaptive_kl``: the learning rate follows the KL of the current policy from
the sampling one (algorithms/learners.py, ``adapted_lr``, ``_adapt_lr_to_kl``). The rule alone,
then real PPO and APPO Learners built in this process (no Ray) on batches whose sampling policy
is the learner's own (KL about 0: the rate grows) or far from it (the rate falls)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

T = 16  # steps per episode chunk
LR = 3e-4


def test_the_rule_moves_the_rate_by_a_factor_within_its_bounds():
    from raylab.algorithms.learners import ADAPTIVE_LR_BOUNDS, adapted_lr

    assert adapted_lr(1e-3, 0.05, 0.01) == pytest.approx(1e-3 / 1.5)  # above 2 x target
    assert adapted_lr(1e-3, 0.001, 0.01) == pytest.approx(1e-3 * 1.5)  # below target / 2
    assert adapted_lr(1e-3, 0.01, 0.01) == 1e-3  # near the target: unchanged
    assert adapted_lr(1e-3, 0.019, 0.01) == 1e-3 and adapted_lr(1e-3, 0.006, 0.01) == 1e-3
    assert adapted_lr(ADAPTIVE_LR_BOUNDS[1], 0.0, 0.01) == ADAPTIVE_LR_BOUNDS[1]
    assert adapted_lr(ADAPTIVE_LR_BOUNDS[0], 1.0, 0.01) == ADAPTIVE_LR_BOUNDS[0]
    assert adapted_lr(1e-3, float("nan"), 0.01) == pytest.approx(1e-3 / 1.5)


def _learner(algo: str, *overrides: str):
    import gymnasium as gym

    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    env = gym.make("Pendulum-v1")
    spaces = {"__env__": (env.observation_space, env.action_space)}
    spaces["default_policy"] = spaces["__env__"]
    env.close()
    cfg = compose(
        algo,
        "Pendulum-v1",
        "mujoco",
        ["algo.hidden=[16]", f"algo.lr={LR}", "algo.lr_schedule=adaptive_kl", *overrides],
    )
    learner = build_algorithm_config(cfg).build_learner(spaces=spaces)
    learner.build()
    return learner


def _episodes(learner, n: int, shift: float):
    """n chunks of T steps whose stored distribution inputs are the learner's own policy's,
    with the mean moved by ``shift`` (0: the sampling policy is the current one)."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    rng = np.random.default_rng(0)
    module = learner.module["default_policy"].unwrapped()
    out = []
    for _ in range(n):
        obs = rng.normal(size=(T + 1, 3)).astype(np.float32)
        with torch.no_grad():
            inputs = module.forward_exploration({Columns.OBS: torch.from_numpy(obs[:T])})[
                Columns.ACTION_DIST_INPUTS
            ].clone()
        inputs[:, 0] += shift  # the mean of the one action dimension
        dist = module.get_exploration_action_dist_cls().from_logits(inputs)
        actions = dist.sample()
        out.append(
            SingleAgentEpisode(
                observations=list(obs),
                actions=list(actions.numpy()),
                rewards=list(rng.normal(size=T)),
                extra_model_outputs={
                    Columns.ACTION_LOGP: list(dist.logp(actions).numpy()),
                    Columns.ACTION_DIST_INPUTS: list(inputs.numpy()),
                },
                len_lookback_buffer=0,
            ).to_numpy()
        )
    return out


def _lr(learner) -> float:
    ((_, optimizer),) = learner.get_optimizers_for_module("default_policy")
    return optimizer.param_groups[0]["lr"]


def _ppo_batch(learner, n: int, shift: float):
    """A PPO train batch of n rows (advantages and value targets given, as GAE would leave
    them) whose stored distribution inputs are the learner's own policy's, the mean moved by
    ``shift``."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    rng = np.random.default_rng(1)
    module = learner.module["default_policy"].unwrapped()
    obs = torch.from_numpy(rng.normal(size=(n, 3)).astype(np.float32))
    with torch.no_grad():
        inputs = module.forward_exploration({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS].clone()
    inputs[:, 0] += shift
    dist = module.get_exploration_action_dist_cls().from_logits(inputs)
    actions = dist.sample()
    columns = {
        Columns.OBS: obs.numpy(),
        Columns.ACTIONS: actions.numpy(),
        Columns.ACTION_LOGP: dist.logp(actions).numpy(),
        Columns.ACTION_DIST_INPUTS: inputs.numpy(),
        Postprocessing.ADVANTAGES: rng.normal(size=n).astype(np.float32),
        Postprocessing.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
    }
    return MultiAgentBatch({"default_policy": SampleBatch(columns)}, env_steps=n)


@pytest.mark.parametrize("shift, grows", [(0.0, True), (5.0, False)])
def test_ppo_moves_its_rate_once_per_minibatch_and_keeps_it(shift, grows):
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = _learner("ppo", "algo.train_batch_size=64", "algo.minibatch_size=32")
    results = learner.update(
        batch=_ppo_batch(learner, 64, shift),
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0},
        num_epochs=2,
        minibatch_size=32,
    )
    factor = 1.5**4 if grows else 1.5**-4  # 2 epochs x 2 minibatches
    assert _lr(learner) == pytest.approx(LR * factor)
    # RLlib's end-of-update bookkeeping reports the adapted rate, not the configured one.
    logged = results["default_policy"]["default_optimizer_learning_rate"]
    assert float(logged) == pytest.approx(LR * factor)
    # ... and the next update starts from it.
    learner.update(
        batch=_ppo_batch(learner, 64, shift),
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 64},
        num_epochs=1,
        minibatch_size=32,
    )
    assert _lr(learner) == pytest.approx(LR * factor * (1.5**2 if grows else 1.5**-2))


def test_ppo_with_a_constant_rate_does_not_move_it():
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = _learner("ppo", "algo.lr_schedule=constant", "algo.minibatch_size=32")
    learner.update(
        batch=_ppo_batch(learner, 64, 5.0),
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0},
        num_epochs=2,
        minibatch_size=32,
    )
    assert _lr(learner) == pytest.approx(LR)


@pytest.mark.parametrize("shift, grows", [(0.0, True), (5.0, False)])
def test_appo_moves_its_rate_in_its_loss(shift, grows):
    """APPO's learner thread computes each batch's loss through compute_loss_for_module; the
    rate is moved there, before that batch's optimizer step."""
    learner = _learner("appo", f"algo.rollout_fragment_length={T + 1}")
    batch = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=_episodes(learner, 2, shift), shared_data={}
    )["default_policy"]
    batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    module = learner.module["default_policy"]
    learner.compute_loss_for_module(
        module_id="default_policy",
        config=learner.config.get_config_for_module("default_policy"),
        batch=batch,
        fwd_out=module.forward_train(batch),
    )
    assert _lr(learner) == pytest.approx(LR * 1.5 if grows else LR / 1.5)


def test_a_bad_kl_target_is_refused_in_one_line():
    from raylab.config import compose
    from raylab.errors import UserError

    with pytest.raises(UserError, match=r"algo.lr_kl_target=0.0.*above 0"):
        compose("ppo", "Pendulum-v1", "mujoco", ["algo.lr_kl_target=0.0"])
    with pytest.raises(UserError, match=r"lr_kl_target=0.02 does nothing.*adaptive_kl"):
        compose("appo", "Pendulum-v1", "mujoco", ["algo.lr_kl_target=0.02"])


def test_the_kl_target_reaches_the_learner():
    from raylab.algorithms.build import DEFAULT_LR_KL_TARGET, build_algorithm_config
    from raylab.config import compose

    def target(*overrides):
        cfg = compose("ppo", "Pendulum-v1", "mujoco", list(overrides))
        return build_algorithm_config(cfg).learner_config_dict.get("lr_kl_target")

    assert target() is None  # constant rate: the learner adapts nothing
    assert target("algo.lr_schedule=adaptive_kl") == DEFAULT_LR_KL_TARGET
    assert target("algo.lr_schedule=adaptive_kl", "algo.lr_kl_target=0.03") == 0.03
