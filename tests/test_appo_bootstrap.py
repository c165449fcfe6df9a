"""APPO's value targets bootstrap at the end of every episode chunk (algorithms/learners.py,
``weightless_phantom_steps``): the real learner, its real learner connector and RLlib's V-trace,
on a chunk whose values are known; and its batches are ``train_batch_size`` rows however large a
sample is (``batches_of_rows``). No Ray: the Learner is built in this process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

T = 4  # real steps in the chunk (the rollout fragment)
GAMMA = 0.9


def _learner(
    overrides=("algo.hidden=[16]", f"algo.gamma={GAMMA}", f"algo.rollout_fragment_length={T + 1}"),
):
    import gymnasium as gym

    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    env = gym.make("Pendulum-v1")
    spaces = {"__env__": (env.observation_space, env.action_space)}
    spaces["default_policy"] = spaces["__env__"]
    env.close()
    cfg = compose("appo", "Pendulum-v1", "mujoco", list(overrides))
    learner = build_algorithm_config(cfg).build_learner(spaces=spaces)
    learner.build()
    return learner


def _chunk_batch(learner, terminated: bool):
    """A T-step chunk through the learner's connector (which appends the bootstrap step), its
    behaviour log-probs the target network's own, so every importance weight is 1."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T + 1, 3)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(T, 1)).astype(np.float32)
    module = learner.module["default_policy"].unwrapped()
    with torch.no_grad():
        inputs = module.forward_target({Columns.OBS: torch.from_numpy(obs[:T])})
        dist = module.get_train_action_dist_cls().from_logits(
            next(v for k, v in inputs.items() if "action_dist" in k.lower())
        )
        logp = dist.logp(torch.from_numpy(actions)).numpy()
    episode = SingleAgentEpisode(
        observations=list(obs),
        actions=list(actions),
        rewards=[1.0] * T,
        extra_model_outputs={Columns.ACTION_LOGP: list(logp)},
        terminated=terminated,
        len_lookback_buffer=0,
    ).to_numpy()
    batch = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=[episode], shared_data={}
    )["default_policy"]
    return {k: torch.as_tensor(v) for k, v in batch.items()}, torch.from_numpy(obs)


def _value_targets(learner, batch, monkeypatch):
    """RLlib's V-trace value targets as the learner's loss computes them (a spy that calls
    through), with the module's values of the chunk's observations."""
    import ray.rllib.algorithms.appo.torch.appo_torch_learner as appo_mod

    seen = {}
    real = appo_mod.vtrace_torch

    def spy(**kw):
        out = real(**kw)
        seen["vs"], seen["values"] = out[0][:, 0].detach(), kw["values"][:, 0].detach()
        return out

    monkeypatch.setattr(appo_mod, "vtrace_torch", spy)
    module = learner.module["default_policy"]
    fwd_out = module.forward_train(batch)
    learner.compute_loss_for_module(
        module_id="default_policy",
        config=learner.config.get_config_for_module("default_policy"),
        batch=batch,
        fwd_out=fwd_out,
    )
    return seen["vs"], seen["values"]


@pytest.mark.parametrize("terminated", [False, True])
def test_the_last_step_of_a_chunk_bootstraps_from_the_value_of_its_next_state(
    terminated, monkeypatch
):
    from ray.rllib.core.columns import Columns

    learner = _learner()
    batch, _ = _chunk_batch(learner, terminated)
    assert batch[Columns.LOSS_MASK].tolist() == [True] * T + [False]  # the appended step
    vs, values = _value_targets(learner, batch, monkeypatch)
    bootstrap = 0.0 if terminated else GAMMA * values[T]  # V(s_T), the chunk's last obs
    assert float(vs[T - 1]) == pytest.approx(1.0 + float(bootstrap), abs=1e-4)
    assert abs(float(values[T])) > 1e-3  # a value that would show if it were dropped
    for t in range(T - 1):  # and back through the chunk: vs_t = r + gamma vs_(t+1)
        assert float(vs[t]) == pytest.approx(1.0 + GAMMA * float(vs[t + 1]), abs=1e-4)


def test_without_the_fix_rllib_s_loss_drops_the_bootstrap(monkeypatch):
    """The premise: RLlib's own loss on the same batch ends the chunk as if it terminated."""
    from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner

    learner = _learner()
    batch, _ = _chunk_batch(learner, terminated=False)
    monkeypatch.setattr(
        type(learner),
        "compute_loss_for_module",
        lambda self, **kw: APPOTorchLearner.compute_loss_for_module(self, **kw),
    )
    vs, values = _value_targets(learner, batch, monkeypatch)
    assert float(vs[T - 1]) == pytest.approx(1.0, abs=1e-4)
    assert float(vs[T - 1]) != pytest.approx(1.0 + GAMMA * float(values[T]), abs=1e-3)


def _episode(rng, steps: int):
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return SingleAgentEpisode(
        observations=list(rng.normal(size=(steps + 1, 3)).astype(np.float32)),
        actions=list(rng.uniform(-1, 1, size=(steps, 1)).astype(np.float32)),
        rewards=[1.0] * steps,
        extra_model_outputs={Columns.ACTION_LOGP: [np.float32(-1.0)] * steps},
        len_lookback_buffer=0,
    ).to_numpy()


def test_a_sample_larger_than_the_train_batch_is_trained_as_batches_of_its_size(ray_in_process):
    """APPO trains on whole samples: one of 8 envs x 5 steps with ``train_batch_size=10``
    would be one 40-row batch, a quarter of the gradient steps per env step the option asks
    for. The learner queues it as four batches of 10 rows, and one sample of 10 rows as one.

    Ray runs in this process first (``ray_in_process``): the learner thread puts its weights
    into Ray's object store after an update, and without a Ray it would start one from that
    thread, whose processes the kernel kills when the thread ends (``learner.shutdown()``);
    the test process, a driver of that Ray, then exits at once, in whatever test it is running
    (an xdist worker "not properly terminated")."""
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from raylab.algorithms.learners import batches_of_rows

    rng = np.random.default_rng(0)
    chunks = [_episode(rng, 5) for _ in range(8)]
    groups = batches_of_rows(chunks, 10)
    assert [sum(len(e) for e in g) for g in groups] == [10, 10, 10, 10]
    assert [e for g in groups for e in g] == chunks  # consecutive, nothing left out
    # 14 rows are 1.4 batches: rounded to one, chunks never cut
    assert [len(g) for g in batches_of_rows([_episode(rng, 7)] * 2, 10)] == [2]

    learner = _learner(
        ["algo.hidden=[16]", "algo.train_batch_size=10", "algo.rollout_fragment_length=5"]
    )
    try:
        ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 40}
        learner.update(TrainingData(episodes=chunks), timesteps=ts)
        assert learner._ring_status()["ingested"] == 4
        learner.update(TrainingData(episodes=chunks[:2]), timesteps=ts)
        assert learner._ring_status()["ingested"] == 5
    finally:
        learner.shutdown()  # its learner thread
