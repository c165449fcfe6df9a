"""The asymmetric actor-critic (algorithms/modules.py): the policy ignores the privileged part
of the observation, the value function uses it; and the option is refused where it would leak."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

import raylab.envs  # noqa: F401
from raylab.algorithms.build import actor_obs_dim, rl_module_options
from raylab.algorithms.modules import AsymmetricPPOModule
from raylab.config import compose
from raylab.errors import UserError


def _module(inference_only: bool = False, algo: str = "ppo"):
    cfg = compose(algo, "go2_joystick_flat", "mujoco", ["env.privileged_obs=true"])
    opts = rl_module_options(cfg)
    spec = opts["rl_module_spec"]
    env = gym.make_vec(
        cfg.env.gym_id, num_envs=1, vectorization_mode="vector_entry_point", privileged_obs=True
    )
    built = RLModuleSpec(
        module_class=spec.module_class,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        model_config=spec.model_config,
        inference_only=inference_only,
    ).build()
    env.close()
    return cfg, built


def test_the_policy_ignores_the_privileged_part_the_critic_does_not():
    cfg, module = _module()
    assert isinstance(module, AsymmetricPPOModule)
    k = actor_obs_dim(cfg)
    assert k == 49  # go2's policy observation; 12 privileged entries follow
    obs = torch.randn(8, module.observation_space.shape[0])
    other = obs.clone()
    other[:, k:] = torch.randn(8, obs.shape[1] - k) * 5.0
    with torch.no_grad():
        a = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        b = module.forward_inference({Columns.OBS: other})[Columns.ACTION_DIST_INPUTS]
        assert torch.equal(a, b)
        va, vb = (
            module.compute_values({Columns.OBS: obs}),
            module.compute_values({Columns.OBS: other}),
        )
        assert not torch.allclose(va, vb)
        train = module.forward_train({Columns.OBS: obs})
        assert torch.equal(train[Columns.ACTION_DIST_INPUTS], a)
        assert torch.allclose(
            module.compute_values({Columns.OBS: obs}, embeddings=train[Columns.EMBEDDINGS]), va
        )
        changed = obs.clone()
        changed[:, 0] += 1.0  # a policy entry does move the policy
        assert not torch.equal(
            module.forward_inference({Columns.OBS: changed})[Columns.ACTION_DIST_INPUTS], a
        )


def test_an_inference_only_module_needs_no_critic():
    _, module = _module(inference_only=True)
    assert module.encoder.critic_encoder is None
    out = module.forward_exploration(
        {Columns.OBS: torch.zeros(2, module.observation_space.shape[0])}
    )
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 24)


def test_privileged_obs_appends_after_the_policy_observation():
    plain = gym.make_vec(
        "raylab/Go2JoystickFlat-v0", num_envs=3, vectorization_mode="vector_entry_point"
    )
    priv = gym.make_vec(
        "raylab/Go2JoystickFlat-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        privileged_obs=True,
    )
    a, _ = plain.reset(seed=3)
    b, _ = priv.reset(seed=3)
    for _ in range(5):
        act = np.full((3, 12), 0.1, dtype=np.float32)
        a, *_ = plain.step(act)
        b, *_ = priv.step(act)
    assert priv.actor_obs_dim == plain.actor_obs_dim == a.shape[1] == 49
    np.testing.assert_array_equal(b[:, :49], a)  # the policy's observation is unchanged
    np.testing.assert_allclose(b[:, 49:52], priv.unwrapped.lin_vel, rtol=1e-6, atol=1e-6)
    plain.close()
    priv.close()


def test_appo_target_policy_sees_only_the_policy_part():
    from ray.rllib.core.rl_module.apis.target_network_api import TARGET_NETWORK_ACTION_DIST_INPUTS

    cfg, module = _module(algo="appo")
    module.make_target_networks()
    k = actor_obs_dim(cfg)
    obs = torch.randn(4, module.observation_space.shape[0])
    other = obs.clone()
    other[:, k:] += 3.0
    with torch.no_grad():
        a = module.forward_target({Columns.OBS: obs})[TARGET_NETWORK_ACTION_DIST_INPUTS]
        b = module.forward_target({Columns.OBS: other})[TARGET_NETWORK_ACTION_DIST_INPUTS]
        assert torch.equal(a, b)
        # The target starts as a copy of the policy.
        assert torch.allclose(
            a, module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        )


def test_privileged_obs_is_refused_where_the_policy_would_see_it():
    with pytest.raises(UserError, match="privileged_obs=true needs --algo ppo or appo"):
        compose("sac", "go2_joystick_flat", "mujoco", ["env.privileged_obs=true"])


def test_go2_defaults_to_the_asymmetric_critic_for_ppo_and_appo_only():
    for algo in ("ppo", "appo"):
        cfg = compose(algo, "go2_joystick_flat", "mujoco", [])
        assert cfg.env.privileged_obs is True and cfg.env.num_envs == 32
        assert rl_module_options(cfg)["rl_module_spec"].module_class.__name__.startswith(
            "Asymmetric"
        )
    assert compose("sac", "go2_joystick_flat", "mujoco", []).env.privileged_obs is False
    assert (
        compose(
            "ppo", "go2_joystick_flat", "mujoco", ["env.privileged_obs=false"]
        ).env.privileged_obs
        is False
    )


def test_balance_privileged_obs_is_the_same_in_the_reference_and_the_batched_env():
    vec = gym.make_vec(
        "raylab/MicroduckBalance-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        privileged_obs=True,
    )
    refs = [gym.make("raylab/MicroduckBalance-v0", privileged_obs=True) for _ in range(3)]
    obs, _ = vec.reset(seed=5)
    assert obs.shape == (3, 52) and vec.actor_obs_dim == 48
    np.testing.assert_array_equal(
        obs, np.stack([e.reset(seed=5 + i)[0] for i, e in enumerate(refs)])
    )
    rng = np.random.default_rng(0)
    for _ in range(60):
        act = rng.uniform(-1, 1, (3, 14)).astype(np.float32)
        obs, *_ = vec.step(act)
        np.testing.assert_array_equal(
            obs, np.stack([e.step(act[i])[0] for i, e in enumerate(refs)])
        )
    # The policy's 48 entries are the plain task's; the last one is the trunk height.
    np.testing.assert_allclose(obs[:, 51], vec.unwrapped.trunk_height, rtol=1e-6)
    vec.close()


def _raylab_module(algo: str, overrides):
    """raylab's PPO / APPO module for microduck_balance with these overrides, built locally."""
    cfg = compose(algo, "microduck_balance", "mujoco", overrides)
    spec = rl_module_options(cfg)["rl_module_spec"]
    env = gym.make_vec(cfg.env.gym_id, num_envs=1, vectorization_mode="vector_entry_point")
    module = RLModuleSpec(
        module_class=spec.module_class,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        model_config=spec.model_config,
    ).build()
    env.close()
    return module


def test_max_log_std_bounds_the_policy_std_softly():
    """algo.max_log_std: raylab's module on a task without privileged state too; the log std
    never exceeds the bound, stays close to the raw output well below it, and gradients flow."""
    from raylab.algorithms.modules import bound_log_std

    log_std = torch.tensor([[0.3, -4.0, 5.0], [-0.3, -1.0, 0.0]])
    raw = torch.cat([torch.zeros(2, 3), log_std], dim=-1)  # [mean (3), log_std (3)] per row
    out = bound_log_std(raw, -0.5)
    assert torch.equal(out[:, :3], raw[:, :3])  # the mean is untouched
    assert torch.all(out[:, 3:] < -0.5)
    assert abs(float(out[0, 4]) - -4.0) < 0.05  # far below the bound: nearly the raw value
    assert torch.equal(bound_log_std(raw, None), raw)

    for algo in ("ppo", "appo"):
        module = _raylab_module(algo, ["algo.max_log_std=-0.5"])
        with torch.no_grad():
            for p in module.pi.parameters():  # a policy head that asks for a huge std
                p.fill_(1.0)
        obs = torch.randn(16, module.observation_space.shape[0], requires_grad=False)
        dist_inputs = module.forward_train({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        log_std = dist_inputs[:, 14:]
        assert torch.all(log_std < -0.5), algo
        log_std.sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.pi.parameters())
    # Without the option (and without reward scaling, whose statistics live in raylab's
    # module: APPO's default on this task) the module is RLlib's default one.
    assert "rl_module_spec" not in rl_module_options(compose("ppo", "microduck_balance"))


def test_the_scheduled_log_std_bound_moves_linearly_then_stays():
    """algo.final_max_log_std: the module's bound is max_log_std at env step 0, moves linearly
    to final_max_log_std at training.total_steps and stays there; the std follows it down."""
    from raylab.algorithms.modules import scheduled_log_std_bound

    assert scheduled_log_std_bound(1.0, -2.0, 1000, 0) == 1.0
    assert scheduled_log_std_bound(1.0, -2.0, 1000, 500) == pytest.approx(-0.5)
    assert scheduled_log_std_bound(1.0, -2.0, 1000, 5000) == -2.0
    # With a time budget: whichever of steps and seconds is further along.
    assert scheduled_log_std_bound(1.0, -2.0, 1000, 100, 60.0, 30.0) == pytest.approx(-0.5)
    assert scheduled_log_std_bound(1.0, -2.0, 1000, 500, 60.0, 6.0) == pytest.approx(-0.5)
    assert scheduled_log_std_bound(1.0, -2.0, 1000, 0, 60.0, 600.0) == -2.0

    overrides = [
        "algo.max_log_std=1.0",
        "algo.final_max_log_std=-2.0",
        "training.total_steps=1000",
        "training.time_budget_s=null",  # steps only
    ]
    module = _raylab_module("ppo", overrides)
    obs = torch.randn(8, module.observation_space.shape[0])

    def max_log_std():
        with torch.no_grad():
            out = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        return float(out[:, 14:].max())

    assert float(module.log_std_bound) == 1.0
    early = max_log_std()
    module.set_log_std_bound(750)
    assert float(module.log_std_bound) == pytest.approx(-1.25)
    late = max_log_std()
    assert late < -1.25 < early
    assert "log_std_bound" in module.get_state()  # it travels with the weights
    # Without a time budget the seconds the Learner passes do not move it.
    module.set_log_std_bound(750, add_seconds=1e6)
    assert float(module.log_std_bound) == pytest.approx(-1.25)


def test_with_a_time_budget_the_bound_reaches_its_end_with_the_budget():
    """training.time_budget_s: the bound moves with the run's seconds as the Learner counts
    them (a module buffer, so a restored module goes on from there) when they are further along
    than the env steps, and reaches final_max_log_std when the budget ends."""
    overrides = [
        "algo.max_log_std=1.0",
        "algo.final_max_log_std=-2.0",
        "training.total_steps=1000000",
        "training.time_budget_s=100",
    ]
    module = _raylab_module("ppo", overrides)
    module.set_log_std_bound(1000, add_seconds=25.0)  # a quarter of the budget, few steps
    assert float(module.log_std_bound) == pytest.approx(0.25)
    state = module.get_state()
    assert float(state["log_std_schedule_s"]) == 25.0
    restored = _raylab_module("ppo", overrides)
    restored.set_state(state)
    restored.set_log_std_bound(1000, add_seconds=25.0)  # goes on: half the budget
    assert float(restored.log_std_bound) == pytest.approx(-0.5)
    restored.set_log_std_bound(900_000, add_seconds=1.0)  # the steps are further along now
    assert float(restored.log_std_bound) == pytest.approx(1.0 - 3.0 * 0.9)
    restored.set_log_std_bound(900_000, add_seconds=100.0)
    assert float(restored.log_std_bound) == -2.0


@pytest.mark.parametrize(
    "algo,task,extra",
    [
        ("ppo", "Pendulum-v1", []),
        ("appo", "Pendulum-v1", []),
        ("appo", "microduck_balance", ["algo.max_log_std=-1.0"]),  # raylab's module
    ],
)
def test_free_log_std_is_one_learned_parameter_set_to_init_log_std(algo, task, extra):
    """algo.free_log_std: the Learner's policy head outputs the mean only, and the log std is
    a parameter of its own (trained by the optimizer), set to init_log_std at build; every
    observation gets the same log std (then bounded by max_log_std where set)."""
    from raylab.algorithms.build import build_algorithm_config

    overrides = ["algo.free_log_std=true", "algo.init_log_std=-0.5", "algo.hidden=[32,32]"]
    cfg = compose(algo, task, "mujoco", overrides + extra)
    if task in ("microduck_balance",):
        env = gym.make_vec(cfg.env.gym_id, num_envs=1, vectorization_mode="vector_entry_point")
        obs_space, act_space = env.single_observation_space, env.single_action_space
    else:
        env = gym.make(task)
        obs_space, act_space = env.observation_space, env.action_space
    env.close()
    learner = build_algorithm_config(cfg).build_learner(
        spaces={"__env__": (obs_space, act_space), "default_policy": (obs_space, act_space)}
    )
    learner.build()
    module = learner.module["default_policy"].unwrapped()
    act_dim = act_space.shape[0]
    assert module.pi.log_std.shape == (act_dim,)
    assert torch.all(module.pi.log_std == -0.5)
    optimized = [
        p
        for _, opt in learner.get_optimizers_for_module("default_policy")
        for group in opt.param_groups
        for p in group["params"]
    ]
    assert any(p is module.pi.log_std for p in optimized)
    obs = torch.randn(6, obs_space.shape[0])
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    mean, log_std = out[:, :act_dim], out[:, act_dim:]
    assert float(mean.abs().max()) < 0.05  # init_policy_scale: near-zero initial mean
    expected = -0.5 if not extra else -1.0 - float(torch.nn.functional.softplus(torch.tensor(-0.5)))
    torch.testing.assert_close(log_std, torch.full_like(log_std, expected))


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_orthogonal_init_gives_the_reference_gains(algo):
    """algo.orthogonal_init: every hidden layer of the Learner's module is orthogonal with gain
    sqrt(2) (W W^T = 2 I on its smaller side) and zero biases, the value output has gain 1 and
    the policy's mean output gain init_policy_scale; without the option torch's default
    initialisation stays (not orthogonal)."""
    from raylab.algorithms.build import build_algorithm_config

    def learner_module(extra):
        cfg = compose(algo, "Pendulum-v1", "mujoco", ["algo.hidden=[32,16]"] + extra)
        env = gym.make("Pendulum-v1")
        spaces = (env.observation_space, env.action_space)
        env.close()
        learner = build_algorithm_config(cfg).build_learner(
            spaces={"__env__": spaces, "default_policy": spaces}
        )
        learner.build()
        return learner.module["default_policy"].unwrapped()

    def gram(layer):
        w = layer.weight.detach().double()
        return w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w

    def linears(part):
        return [m for m in part.modules() if isinstance(m, torch.nn.Linear)]

    module = learner_module(["algo.orthogonal_init=true", "algo.init_policy_scale=0.01"])
    hidden = linears(module.encoder)
    assert len(hidden) == 4  # actor and critic encoders, 32 and 16 units each
    for layer in hidden:
        n = min(layer.weight.shape)
        torch.testing.assert_close(
            gram(layer), 2.0 * torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-5
        )
        assert torch.all(layer.bias == 0)
    vf_out = linears(module.vf)[-1]
    torch.testing.assert_close(gram(vf_out), torch.eye(1, dtype=torch.float64), rtol=0, atol=1e-5)
    pi_out = linears(module.pi)[-1]
    mean_rows = pi_out.weight[:1].detach().double()  # Pendulum: one action; [mean, log_std]
    torch.testing.assert_close(
        mean_rows @ mean_rows.T, torch.full((1, 1), 1e-4).double(), rtol=1e-4, atol=0
    )

    default = learner_module([])
    layer = linears(default.encoder)[0]
    n = min(layer.weight.shape)
    assert not torch.allclose(gram(layer), 2.0 * torch.eye(n, dtype=torch.float64), atol=0.1)


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_the_learner_s_adam_is_fused_and_steps_with_adam_eps(algo):
    """algo.adam_eps: the Learner's Adam optimizers step with it (default torch's 1e-8); they
    are torch's fused Adam (one kernel over all parameters, not a Python loop)."""
    from raylab.algorithms.build import build_algorithm_config

    env = gym.make("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    env.close()
    for extra, eps in (([], 1e-8), (["algo.adam_eps=1e-5"], 1e-5)):
        cfg = compose(algo, "Pendulum-v1", "mujoco", ["algo.hidden=[16]"] + extra)
        learner = build_algorithm_config(cfg).build_learner(
            spaces={"__env__": spaces, "default_policy": spaces}
        )
        learner.build()
        groups = [
            g
            for _, opt in learner.get_optimizers_for_module("default_policy")
            for g in opt.param_groups
        ]
        assert groups and all(g["eps"] == eps for g in groups), (extra, groups)
        assert all(g["fused"] and not g["foreach"] for g in groups), groups
