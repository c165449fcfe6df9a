"""tanh by way of sigmoid (algorithms/activations.py): the same function and gradient as
torch's tanh, and the only tanh of the networks the Learners, the EnvRunners and `raylab eval`
build. No Ray: Learner and EnvRunner are built in this process."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from raylab.algorithms.activations import FastTanh, use_fast_tanh
from raylab.algorithms.build import build_algorithm_config
from raylab.config import compose


def test_fast_tanh_is_tanh_forward_and_backward():
    x = torch.cat([torch.linspace(-30, 30, 20001), torch.tensor([0.0, -0.0, 1e-8, -1e-8])])
    x = x.double().float().requires_grad_(True)
    y = FastTanh()(x)
    g = torch.randn_like(x)
    (dx,) = torch.autograd.grad(y, x, g)
    ref = torch.tanh(x.detach())
    assert (y.detach() - ref).abs().max() <= 4e-7
    assert (y.detach().abs() <= 1.0).all()
    assert torch.allclose(dx, g * (1 - ref * ref), atol=1e-6)
    with torch.no_grad():  # the inference path (EnvRunners, evaluation) computes the same
        assert torch.equal(FastTanh()(x), y.detach())


def test_swap_replaces_every_tanh_and_nothing_else():
    net = torch.nn.Sequential(
        torch.nn.Linear(3, 4),
        torch.nn.Tanh(),
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.ReLU()),
    )
    x = torch.randn(5, 3)
    before = net(x)
    assert use_fast_tanh(net) == 2
    assert not any(type(m) is torch.nn.Tanh for m in net.modules())
    assert sum(isinstance(m, FastTanh) for m in net.modules()) == 2
    assert any(isinstance(m, torch.nn.ReLU) for m in net.modules())
    assert torch.allclose(net(x), before, atol=1e-6)
    assert use_fast_tanh(net) == 0


def _kinds(module) -> set:
    return {type(m).__name__ for m in module.modules()}


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_learner_and_env_runner_networks_use_fast_tanh(algo):
    """The Learner's networks (APPO's target copy included) and an EnvRunner's module."""
    from raylab.algorithms.env_runner import RaylabFastEnvRunner

    env = gym.make("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    env.close()
    cfg = compose(algo, "Pendulum-v1", "mujoco", ["algo.hidden=[16,16]", "env.num_envs=2"])
    config = build_algorithm_config(cfg)
    learner = config.build_learner(spaces={"__env__": spaces, "default_policy": spaces})
    learner.build()
    module = learner.module["default_policy"]
    assert "Tanh" not in _kinds(module) and "FastTanh" in _kinds(module)
    if algo == "appo":  # the target network is a copy made after the swap
        assert "FastTanh" in _kinds(module._old_encoder)
    runner = RaylabFastEnvRunner(config=config, worker_index=1)
    try:
        assert "Tanh" not in _kinds(runner.module)
        assert "FastTanh" in _kinds(runner.module)
    finally:
        runner.stop()
