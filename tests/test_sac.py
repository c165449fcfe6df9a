"""raylab's SAC: device replay ring, replay ratio, the fused update, data parallel, learning."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import head_driver_env, run_cli

from raylab.algorithms.sac import owed_updates
from raylab.algorithms.sac.replay import DeviceReplay
from raylab.algorithms.sac.update import squashed_gaussian_sample
from raylab.metrics import schema as S
from raylab.metrics.extract import extract
from raylab.metrics.rundir import read_summary


def batch(n, start=0, obs_dim=3, act_dim=1):
    idx = np.arange(start, start + n, dtype=np.float32)
    return {
        "obs": np.repeat(idx[:, None], obs_dim, 1),
        "actions": np.repeat(idx[:, None], act_dim, 1) / 1000,
        "rewards": idx,
        "next_obs": np.repeat(idx[:, None] + 0.5, obs_dim, 1),
        "terminateds": (idx % 7 == 0).astype(np.float32),
    }


def test_replay_ring_wraps_and_keeps_the_newest():
    r = DeviceReplay(capacity=10, obs_dim=3, action_dim=1, batch_size=4, device=torch.device("cpu"))
    assert r.add(batch(6)) == 6 and (r.size, r.pos) == (6, 6)
    r.add(batch(7, start=6))  # 13 in total: wraps, the 3 oldest are overwritten
    assert (r.size, r.pos, r.total_added) == (10, 3, 13)
    stored = sorted(r.storage["rewards"].tolist())
    assert stored == list(range(3, 13))
    # rows stay aligned across fields
    assert torch.equal(r.storage["obs"][:, 0], r.storage["rewards"])
    assert torch.equal(r.storage["next_obs"][:, 0], r.storage["rewards"] + 0.5)


def test_replay_sample_draws_only_valid_rows_into_preallocated_tensors():
    r = DeviceReplay(
        capacity=100, obs_dim=3, action_dim=1, batch_size=32, device=torch.device("cpu")
    )
    r.add(batch(5, start=40))
    out = r.sample()
    assert out is r.out and out["obs"].shape == (32, 3)
    assert set(out["rewards"].tolist()) <= {40.0, 41.0, 42.0, 43.0, 44.0}
    spare = r.new_output()
    out2 = r.sample(out=spare)
    assert out2 is spare and out2["obs"].data_ptr() != out["obs"].data_ptr()


@pytest.mark.parametrize("added", [7, 13])  # the ring part full, and wrapped
def test_a_replay_ring_restored_from_its_state_holds_and_samples_what_the_saved_one_would(added):
    cpu = torch.device("cpu")
    r = DeviceReplay(capacity=10, obs_dim=3, action_dim=1, batch_size=4, device=cpu, seed=5)
    r.add(batch(5))
    r.add(batch(added - 5, start=5))
    r.sample()  # the sampler's random state has moved on from its seed
    state = pickle.loads(pickle.dumps(r.get_state()))  # as a checkpoint stores it
    r.add(batch(2, start=100))  # written after the state was taken: not in the state
    back = DeviceReplay.from_state(state, batch_size=4, device=cpu)
    assert (back.size, back.pos, back.total_added) == (min(added, 10), added % 10, added)
    r = DeviceReplay.from_state(state, batch_size=4, device=cpu)  # the saved ring, again
    for key in r.storage:
        assert torch.equal(back.storage[key], r.storage[key])
    for _ in range(3):
        a, b = r.sample(out=r.new_output()), back.sample(out=back.new_output())
        for key in a:
            assert torch.equal(a[key], b[key])
    # a fresh ring with the same seed draws other rows than the restored one
    fresh = DeviceReplay(capacity=10, obs_dim=3, action_dim=1, batch_size=4, device=cpu, seed=5)
    fresh.add(batch(5))
    fresh.add(batch(added - 5, start=5))
    draws = [fresh.sample()["rewards"].tolist() for _ in range(4)]
    again = DeviceReplay.from_state(state, batch_size=4, device=cpu)
    assert [again.sample()["rewards"].tolist() for _ in range(4)] != draws


def test_replay_refuses_a_batch_bigger_than_capacity_at_construction():
    with pytest.raises(ValueError, match="capacity 8 is smaller than the batch size 16"):
        DeviceReplay(capacity=8, obs_dim=1, action_dim=1, batch_size=16, device=torch.device("cpu"))


def test_replay_ratio_counts_updates_after_learning_starts():
    assert owed_updates(999, 1000, 1.0) == 0
    assert owed_updates(1000, 1000, 1.0) == 1
    assert owed_updates(1100, 1000, 1.0) == 101
    assert owed_updates(1100, 1000, 0.5) == 50
    assert owed_updates(1100, 1000, 4.0) == 404


def test_squashed_gaussian_log_prob_matches_the_change_of_variables():
    torch.manual_seed(0)
    inputs = torch.randn(512, 4)
    action, logp = squashed_gaussian_sample(inputs)
    assert action.abs().max() <= 1  # float32 tanh saturates at exactly 1 far out
    mean, log_std = inputs.chunk(2, -1)
    pre = torch.atanh(action.clamp(-1 + 1e-6, 1 - 1e-6))
    ref = torch.distributions.Normal(mean, log_std.exp()).log_prob(pre).sum(-1)
    ref = ref - torch.log(1 - action.pow(2)).sum(-1)
    # the tail (|action| -> 1) is where the naive formula loses precision
    ok = action.abs().max(-1).values < 0.999
    assert torch.allclose(logp[ok], ref[ok], atol=1e-3)


@pytest.fixture
def learner():
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    cfg = compose(
        "sac",
        "Pendulum-v1",
        overrides=[
            "resources.num_learners=0",
            "algo.hidden=[32,32]",
            "algo.batch_size=16",
            "algo.grad_clip=null",
            "algo.critic_loss=huber",  # what _reference_step writes out
            "algo.learner_threads=1",  # built in this process: keep its torch threads
        ],
    )
    learner = build_algorithm_config(cfg).build_learner(env=gym.make("Pendulum-v1"))
    b = batch(64)
    b["obs"] = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    b["next_obs"] = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    b["rewards"] = np.random.default_rng(2).normal(size=64).astype(np.float32)
    learner._make_replay(b)
    learner._replay.add(b)
    yield learner
    learner.shutdown()


@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_reward_scale_multiplies_the_rewards_in_the_replay(scale):
    """algo.reward_scale: the ring the critics sample from holds the scaled rewards, and nothing
    else of the transition changes."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    cfg = compose(
        "sac",
        "Pendulum-v1",
        overrides=[
            "resources.num_learners=0",
            "algo.hidden=[8]",
            f"algo.reward_scale={scale}",
            "algo.learning_starts=1000000",  # no update is owed: the ring stays as ingested
            "algo.learner_threads=1",
        ],
    )
    learner = build_algorithm_config(cfg).build_learner(env=gym.make("Pendulum-v1"))
    try:
        b = batch(50, start=1)
        learner.ingest([b], 0)
        stored = {k: v[:50].cpu().numpy() for k, v in learner._replay.storage.items()}
        np.testing.assert_allclose(stored["rewards"], b["rewards"] * scale, rtol=1e-6)
        for key in ("obs", "actions", "next_obs", "terminateds"):
            np.testing.assert_array_equal(stored[key].reshape(b[key].shape), b[key])
    finally:
        learner.shutdown()


def test_a_reward_scale_that_is_not_a_positive_number_is_refused():
    from raylab.config import compose
    from raylab.errors import UserError

    for bad in ("0", "-2", "nan"):
        with pytest.raises(UserError, match=rf"algo.reward_scale={bad}.*above 0"):
            compose("sac", "Pendulum-v1", overrides=[f"algo.reward_scale={bad}"])


def _saturated_policy(action_dim: int = 3, obs_dim: int = 4):
    """A policy whose outputs are the pre-tanh mean 60 and log-std -12 for every observation,
    what the joystick task's diverged SAC policies reached."""
    from raylab.algorithms.sac import update as U

    pi = U.mlp(obs_dim, [8], 2 * action_dim)
    with torch.no_grad():
        pi[-1].weight.zero_()
        pi[-1].bias.copy_(torch.tensor([60.0] * action_dim + [-12.0] * action_dim))
    return pi


def test_the_policy_bounds_keep_a_saturated_policys_log_probability_small():
    """algo.log_std_min and algo.mean_bound: the log-std is floored and the pre-tanh mean softly
    bounded, so the log-probability of a saturated, nearly deterministic policy (which enters
    the soft value target as -alpha log pi) stays a few units per action; unbounded, it is over
    a hundred per action. The update's statistics see the same bounds."""
    from raylab.algorithms.sac import update as U

    torch.manual_seed(0)
    pi, obs, dim = _saturated_policy(), torch.randn(64, 4), 3
    noise = torch.randn(64, dim)
    free = U.policy_inputs(pi, obs)
    bounded = U.policy_inputs(pi, obs, log_std_min=-5.0, mean_bound=5.0)
    assert torch.allclose(free[:, :dim], torch.tensor(60.0))
    assert torch.allclose(bounded[:, :dim], torch.tensor(5.0 * float(np.tanh(12.0))))
    assert torch.equal(free[:, dim:], torch.full((64, dim), -12.0))
    assert torch.equal(bounded[:, dim:], torch.full((64, dim), -5.0))
    _, logp_free = squashed_gaussian_sample(free, noise)
    _, logp_bounded = squashed_gaussian_sample(bounded, noise)
    assert logp_free.min() > 100 * dim
    # Gaussian part at most 5 - log(2 pi) / 2, tanh part at most 2 |u| (|u| < 5 + noise)
    cap = dim * (5.0 + 2.0 * (5.0 + float(noise.abs().max()) * np.exp(-5.0)))
    assert logp_bounded.max() < cap < 100 * dim

    qf, qf2 = U.mlp(4 + dim, [8], 1), U.mlp(4 + dim, [8], 1)
    b = {
        "obs": obs,
        "actions": torch.rand(64, dim) * 2 - 1,
        "rewards": torch.ones(64),
        "next_obs": obs,
        "terminateds": torch.zeros(64),
    }
    stats = {}
    for name, bounds in (("free", {}), ("bounded", {"log_std_min": -5.0, "mean_bound": 5.0})):
        parts = U.SACParts(
            pi, qf, qf2, copy.deepcopy(qf), copy.deepcopy(qf2), torch.zeros(1), [], **bounds
        )
        _, stats[name] = U.sac_losses(parts, b, gamma=0.99, target_entropy=-3.0)
    assert float(stats["free"]["logp"]) > 100 * dim > cap > float(stats["bounded"]["logp"])


@pytest.mark.parametrize("bounds", [(), ("algo.log_std_min=-5", "algo.mean_bound=2")])
def test_the_policy_bounds_reach_the_learner_and_the_module_the_env_runners_sample(bounds):
    """The bounds travel in the module's model config: the Learner's update and the module the
    EnvRunners build (and a checkpoint restores) apply the same ones; none by default."""
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose

    cfg = compose(
        "sac",
        "Pendulum-v1",
        overrides=["resources.num_learners=0", "algo.hidden=[8]", "algo.learner_threads=1"]
        + list(bounds),
    )
    config = build_algorithm_config(cfg)
    learner = config.build_learner(env=gym.make("Pendulum-v1"))
    try:
        parts = learner._parts
        floor, bound = (-5.0, 2.0) if bounds else (-20.0, None)
        assert (parts.log_std_min, parts.mean_bound) == (floor, bound)
        spec = config.get_rl_module_spec(env=gym.make("Pendulum-v1"))
        spec.inference_only = True
        runner_module = spec.build()
        runner_module.pi.load_state_dict(_saturated_policy(1, 3).state_dict())
        out = runner_module.policy_inputs(torch.zeros(2, 3))
        assert float(out[0, 1]) == max(-12.0, floor)
        assert float(out[0, 0]) == pytest.approx(60.0 if bound is None else bound, rel=1e-4)
    finally:
        learner.shutdown()


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.log_std_min=3", r"algo.log_std_min=3.*below 2"),
        ("algo.log_std_min=nan", r"algo.log_std_min=nan.*below 2"),
        ("algo.mean_bound=0", r"algo.mean_bound=0.*above 0"),
        ("algo.mean_bound=-1", r"algo.mean_bound=-1.*above 0"),
    ],
)
def test_policy_bounds_out_of_range_are_refused(override, message):
    from raylab.config import compose
    from raylab.errors import UserError

    with pytest.raises(UserError, match=message):
        compose("sac", "Pendulum-v1", overrides=[override])


def test_the_config_knows_the_policys_log_std_ceiling():
    from raylab.algorithms.sac import update as U
    from raylab.config import SAC_LOG_STD_MAX

    assert SAC_LOG_STD_MAX == U.LOG_STD_MAX


def _reference_step(module, log_alpha, opts, b, cfg, target_entropy):
    """Textbook SAC step, written out loss by loss with a backward each."""
    q_opt, pi_opt, a_opt = opts
    alpha = log_alpha.exp().detach()
    with torch.no_grad():
        na, nlp = squashed_gaussian_sample(module.policy_inputs(b["next_obs"]))
        t1, t2 = module.q_values(b["next_obs"], na, target=True)
        y = b["rewards"] + cfg.gamma * (1 - b["terminateds"]) * (torch.min(t1, t2) - alpha * nlp)
    q1, q2 = module.q_values(b["obs"], b["actions"])
    hub = torch.nn.functional.huber_loss
    q_opt.zero_grad()
    (hub(q1, y, delta=1.0) + hub(q2, y, delta=1.0)).backward()
    a, lp = squashed_gaussian_sample(module.policy_inputs(b["obs"]))
    # the actor's gradient goes to the policy only: evaluate the critics as constants
    x = torch.cat([b["obs"], a], -1)
    p1 = torch.func.functional_call(
        module.qf, {n: t.detach() for n, t in module.qf.named_parameters()}, (x,)
    ).squeeze(-1)
    p2 = torch.func.functional_call(
        module.qf_twin, {n: t.detach() for n, t in module.qf_twin.named_parameters()}, (x,)
    ).squeeze(-1)
    pi_opt.zero_grad()
    (alpha * lp - torch.min(p1, p2)).mean().backward()
    a_opt.zero_grad()
    (-(log_alpha * (lp.detach() + target_entropy)).mean()).backward()
    # The critics' grads were taken before the actor pass; step all three now.
    for o in (q_opt, pi_opt, a_opt):
        o.step()
    with torch.no_grad():
        for main, target in module.get_target_network_pairs():
            for p, tp in zip(main.parameters(), target.parameters()):
                tp.lerp_(p, cfg.tau)


def test_fused_update_equals_the_loss_by_loss_update(learner):
    module = learner.module["default_policy"].unwrapped()
    ref_module = copy.deepcopy(module)
    ref_alpha = learner.curr_log_alpha["default_policy"].detach().clone().requires_grad_(True)
    lrs = [o.param_groups[0]["lr"] for o in learner._parts.optimizers]
    ref_opts = (
        torch.optim.Adam(
            list(ref_module.qf.parameters()) + list(ref_module.qf_twin.parameters()),
            lr=lrs[0],
            eps=1e-7,
        ),
        torch.optim.Adam(ref_module.pi.parameters(), lr=lrs[1], eps=1e-7),
        torch.optim.Adam([ref_alpha], lr=lrs[2], eps=1e-7),
    )
    b = {k: v.clone() for k, v in learner._replay.sample().items()}
    before = module.pi[0].weight.detach().clone()
    for _ in range(3):
        torch.manual_seed(7)
        learner._fused_update(b)
        torch.manual_seed(7)
        _reference_step(
            ref_module,
            ref_alpha,
            ref_opts,
            b,
            learner.config,
            learner.target_entropy["default_policy"],
        )
    for (name, p), rp in zip(module.named_parameters(), ref_module.parameters()):
        assert torch.allclose(p, rp, atol=1e-6, rtol=1e-5), name
    assert torch.allclose(learner.curr_log_alpha["default_policy"], ref_alpha, atol=1e-6)
    assert not torch.equal(module.pi[0].weight, before)  # and the update changed the policy


def test_fused_update_keeps_statistics_on_the_device_until_read(learner):
    b = learner._replay.sample()
    learner._fused_update(b)
    learner._fused_update(b)
    assert learner._acc_n == 2 and all(torch.is_tensor(v) for v in learner._acc.values())


def _sac_run(tmp_path, head, seconds, extra=()):
    run_dir = tmp_path / "run"
    r = run_cli(
        "train",
        "--algo",
        "sac",
        "--task",
        "Pendulum-v1",
        f"training.log_dir={run_dir}",
        f"training.time_budget_s={seconds}",
        "resources.dashboard=false",
        "training.terminal=plain",
        # nothing here reads an evaluation (the default evaluates 100 episodes first)
        "training.eval_every=0",
        "training.eval_before_train=false",
        *extra,
        env=head_driver_env(head),  # the session's Ray head (conftest.py)
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_two_learners_all_reduce_gradients(tmp_path, idle_head):
    run_dir = _sac_run(
        tmp_path,
        idle_head,
        15,
        [
            "resources.num_learners=2",
            "env.num_envs=2",
            "algo.learning_starts=100",
            "algo.batch_size=64",
            "algo.hidden=[64,64]",
        ],
    )
    table = extract(run_dir)
    for tag in (S.PERF_DP_GRADIENT_SYNC_MS_PER_RANK, S.PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK):
        assert tag in table.tags, tag
    calls = [v for _, v in table.column(S.PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK) if v is not None]
    # Counted: one all-reduce per update, so a report after several updates counts several (a
    # report of a learner that updated nothing since the previous one counts none).
    assert calls and min(calls) >= 0.0 and max(calls) > 1.0, calls
    manifest = read_summary(run_dir / "run_summary.json")["runtime_manifest"]
    assert len(manifest["learners"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a budget of 900 s (it stops when solved, within minutes)
def test_sac_solves_pendulum_within_20k_env_steps(tmp_path, idle_head):
    # Solved: the mean return of the latest 10 episodes (the reward window) reaches -250.
    run_dir = _sac_run(
        tmp_path,
        idle_head,
        900,
        [
            "env.num_envs=1",
            "training.total_steps=20000",
            "training.stop_reward=-250",
            "training.reward_window=10",
        ],
    )
    table = extract(run_dir)
    curve = [(s, v) for s, v in table.column(S.TRAIN_MEAN_REWARD) if v is not None]
    reached = [s for s, v in curve if v >= -250]
    assert reached and reached[0] <= 20000, curve[-5:]
    print("SAC Pendulum curve (env steps, mean reward):", curve[:: max(1, len(curve) // 12)])


def sac_parts(pi, qf, qf2, lr: float = 1e-3):
    """SACParts of these networks: target copies of the critics, log(alpha) = 0 and the
    Learner's three optimizers (critics, policy, temperature)."""
    from raylab.algorithms.sac import update as U

    log_alpha = torch.zeros(1, requires_grad=True)
    critics = list(qf.parameters()) + list(qf2.parameters())
    return U.SACParts(
        pi,
        qf,
        qf2,
        copy.deepcopy(qf),
        copy.deepcopy(qf2),
        log_alpha,
        [
            torch.optim.Adam(critics, lr=lr),
            torch.optim.Adam(pi.parameters(), lr=lr),
            torch.optim.Adam([log_alpha], lr=lr),
        ],
    )


def test_the_update_step_is_its_losses_then_one_optimizer_step():
    """sac_update = sac_losses (the same statistics under the same noise) + one step that
    moves every trained parameter."""

    import torch

    from raylab.algorithms.sac import update as U

    torch.manual_seed(0)
    pi, qf, qf2 = U.mlp(3, [16], 2), U.mlp(4, [16], 1), U.mlp(4, [16], 1)
    parts = sac_parts(pi, qf, qf2)
    log_alpha = parts.log_alpha
    g = torch.Generator().manual_seed(1)
    b = {
        "obs": torch.randn(8, 3, generator=g),
        "actions": torch.rand(8, 1, generator=g),
        "rewards": torch.randn(8, generator=g),
        "next_obs": torch.randn(8, 3, generator=g),
        "terminateds": torch.zeros(8),
    }
    torch.manual_seed(2)
    _, expected = U.sac_losses(parts, b, gamma=0.99, target_entropy=-1.0)
    before = [p.detach().clone() for p in (*pi.parameters(), *qf.parameters(), log_alpha)]
    torch.manual_seed(2)
    got = U.sac_update(parts, b, gamma=0.99, tau=0.005, target_entropy=-1.0)
    for k, v in expected.items():
        assert torch.equal(v, got[k]), k
    after = (*pi.parameters(), *qf.parameters(), log_alpha)
    assert all(not torch.equal(x, y) for x, y in zip(before, after))


@pytest.mark.parametrize("grad_clip", [None, 0.5])
def test_the_update_split_over_two_threads_computes_what_the_fused_one_does(grad_clip):
    """sac_update with a helper thread (the actor's half there, the critics' here): after
    three steps from the same weights, batches and seed, every weight, target weight, the
    temperature and every statistic are bit-identical to the fused single-thread step's; and
    the actor's half really ran on the helper thread."""
    import copy
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from raylab.algorithms.sac import update as U

    torch.manual_seed(0)
    nets = (U.mlp(5, [32, 32], 4), U.mlp(7, [32, 32], 1), U.mlp(7, [32, 32], 1))

    def make_parts():
        return sac_parts(*copy.deepcopy(nets), lr=1e-2)

    g = torch.Generator().manual_seed(1)
    batches = [
        {
            "obs": torch.randn(64, 5, generator=g),
            "actions": torch.rand(64, 2, generator=g) * 2 - 1,
            "rewards": torch.randn(64, generator=g),
            "next_obs": torch.randn(64, 5, generator=g),
            "terminateds": (torch.rand(64, generator=g) < 0.1).float(),
        }
        for _ in range(3)
    ]
    kw = dict(gamma=0.99, tau=0.05, target_entropy=-2.0, grad_clip=grad_clip, critic_loss="mse")
    fused, split = make_parts(), make_parts()
    seen = set()
    real_actor_half = U.actor_half

    def spy(*args, **kwargs):
        seen.add(threading.current_thread().name)
        return real_actor_half(*args, **kwargs)

    with ThreadPoolExecutor(1, thread_name_prefix="actor-half") as helper:
        for b in batches:
            torch.manual_seed(7)
            want = U.sac_update(fused, b, **kw)
            torch.manual_seed(7)
            U.actor_half = spy
            try:
                got = U.sac_update(split, b, helper=helper, **kw)
            finally:
                U.actor_half = real_actor_half
            assert list(got) == list(want)
            for k in want:
                assert torch.equal(got[k], want[k]), k
    assert seen and all(name.startswith("actor-half") for name in seen)
    for a, b in zip(
        (fused.pi, fused.qf, fused.qf_twin, fused.target_qf, fused.target_qf_twin),
        (split.pi, split.qf, split.qf_twin, split.target_qf, split.target_qf_twin),
    ):
        for x, y in zip(a.parameters(), b.parameters()):
            assert torch.equal(x, y)
    assert torch.equal(fused.log_alpha, split.log_alpha)
    assert not torch.equal(fused.log_alpha, torch.zeros(1))  # it trained


def test_critic_loss_is_huber_or_the_mean_squared_td_error():
    """algo.critic_loss: huber (delta 1) or mse, both on each twin's TD error against the same
    target; large TD errors tell them apart (Huber grows linearly beyond delta)."""
    import copy

    import torch

    from raylab.algorithms.sac import update as U

    torch.manual_seed(0)
    pi, qf, qf2 = U.mlp(3, [16], 2), U.mlp(4, [16], 1), U.mlp(4, [16], 1)
    parts = U.SACParts(pi, qf, qf2, copy.deepcopy(qf), copy.deepcopy(qf2), torch.zeros(1), [])
    g = torch.Generator().manual_seed(1)
    b = {
        "obs": torch.randn(8, 3, generator=g),
        "actions": torch.rand(8, 1, generator=g),
        "rewards": 50.0 * torch.randn(8, generator=g),  # TD errors far beyond Huber's delta
        "next_obs": torch.randn(8, 3, generator=g),
        "terminateds": torch.ones(8),  # target = reward: no noise in it
    }
    q1, q2 = (q.detach() for q in U.q_pair(qf, qf2, b["obs"], b["actions"]))
    target = b["rewards"]
    losses = {}
    for kind in U.CRITIC_LOSSES:
        _, stats = U.sac_losses(parts, b, gamma=0.99, target_entropy=-1.0, critic_loss=kind)
        losses[kind] = float(stats["critic"])
    mse = float(((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean())
    huber = float(
        torch.nn.functional.huber_loss(q1, target) + torch.nn.functional.huber_loss(q2, target)
    )
    assert losses["mse"] == pytest.approx(mse, rel=1e-5)
    assert losses["huber"] == pytest.approx(huber, rel=1e-5)
    assert losses["mse"] > 10 * losses["huber"]


@pytest.mark.parametrize("threads", [None, 2, 64])
def test_learner_threads_sets_the_update_threads_up_to_the_usable_cores(threads):
    from raylab.algorithms.build import build_algorithm_config
    from raylab.config import compose
    from raylab.envs.core.backend import usable_cores

    overrides = ["resources.num_learners=0", "algo.hidden=[32,32]"]
    if threads is not None:
        overrides.append(f"algo.learner_threads={threads}")
    cfg = compose("sac", "microduck_balance", overrides=overrides)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        learner = build_algorithm_config(cfg).build_learner(env=gym.make("Pendulum-v1"))
        # null: resources.num_cpus_per_learner (0.5 here), at least one thread
        assert torch.get_num_threads() == min(threads or 1, usable_cores())
        learner.shutdown()
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_a_checkpoint_with_the_replay_restores_the_ring_the_temperature_and_the_counters(
    tmp_path, _in_process_ray
):
    """algo.store_buffer_in_checkpoints: a real SAC on Pendulum (the test process's Ray) trains
    until its ring (1,500 transitions) has wrapped, is checkpointed and restored into a new
    Algorithm. The restored Learner holds the saved ring, sampler state, temperature and
    counters; its first iterations go on sampling and updating (no random warm-up, no waiting
    for learning_starts new transitions) and the ring keeps its size. Restored from a
    checkpoint taken while updates were owed, it works them off and sampling resumes."""
    import pickle as pkl
    import shutil

    from raylab.algorithms.build import build_algorithm_config
    from raylab.algorithms.sac.learner import REPLAY_STATE, TEMPERATURE_STATE
    from raylab.config import compose
    from raylab.train import algorithm_class

    _in_process_ray.ensure()
    cfg = compose(
        "sac",
        "Pendulum-v1",
        "mujoco",
        [
            "algo.store_buffer_in_checkpoints=true",
            "algo.buffer_capacity=1500",
            "algo.learning_starts=200",
            "algo.batch_size=64",
            "algo.hidden=[32,32]",
            "resources.num_env_runners=1",
            "env.num_envs=4",
            "training.iteration_s=0",
            "training.eval_every=0",
            "training.eval_before_train=false",
        ],
    )

    def on_learner(algo, fn):
        return [r.get() if hasattr(r, "get") else r for r in algo.learner_group.foreach_learner(fn)]

    def learner_view(learner):
        ring = learner._replay
        return {
            "updating": learner._thread is not None and learner._thread.is_alive(),
            "status": learner.status(),
            "log_alpha": float(learner.curr_log_alpha["default_policy"].detach()),
            "ring": ring.get_state() if ring is not None else None,
        }

    algo = algorithm_class("sac")(config=build_algorithm_config(cfg))
    try:
        for _ in range(600):
            algo.train()
            (status,) = on_learner(algo, lambda learner: learner.status())
            if status["ingested"] >= 2500 and status["updates"] >= 1000:
                break
        checkpoint = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    state_file = tmp_path / "ckpt/learner_group/learner/state.pkl"
    saved = pkl.loads(state_file.read_bytes())
    ring = saved[REPLAY_STATE]["ring"]
    assert ring["size"] == 1500 and ring["total_added"] >= 2500  # wrapped
    assert float(saved[TEMPERATURE_STATE][0]) < -0.1  # the temperature moved from log(1) = 0
    ingested = saved[REPLAY_STATE]["ingested"]
    # Two versions of the checkpoint: one with no update owed (restored, the Learner holds the
    # saved state exactly until new transitions arrive), one taken while the Learner was 300
    # updates behind (a stop comes at any moment), far over the 16 the algorithm lets pile up
    # before it requests samples again: the restored Learner must work them off on its own,
    # or nothing moves.
    caught_up = owed_updates(ingested, learning_starts=200, updates_per_step=1.0)
    backlog = shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt_backlog")
    saved[REPLAY_STATE]["updates"] = caught_up
    state_file.write_bytes(pkl.dumps(saved))
    behind = pkl.loads(pkl.dumps(saved))
    behind[REPLAY_STATE]["updates"] = caught_up - 300
    (backlog / "learner_group/learner/state.pkl").write_bytes(pkl.dumps(behind))

    restored = algorithm_class("sac")(config=build_algorithm_config(cfg))
    try:
        restored.restore_from_path(checkpoint)
        (view,) = on_learner(restored, learner_view)
        assert view["status"]["ingested"] == ingested
        assert view["status"]["updates"] == caught_up
        assert view["log_alpha"] == pytest.approx(float(saved[TEMPERATURE_STATE][0]))
        for key, rows in ring["storage"].items():
            np.testing.assert_array_equal(view["ring"]["storage"][key], rows)
        np.testing.assert_array_equal(view["ring"]["generator"], ring["generator"])
        for _ in range(50):  # until the Learner updates again (two iterations were not
            # always enough on a loaded CI machine: the thread had not run its first update yet)
            restored.train()
            (after,) = on_learner(restored, lambda learner: learner.status())
            if after["updates"] > caught_up:
                break
        assert after["ingested"] > ingested  # no random warm-up to wait for
        assert after["updates"] > caught_up
        assert after["size"] == 1500
    finally:
        restored.stop()

    restored = algorithm_class("sac")(config=build_algorithm_config(cfg))
    try:
        restored.restore_from_path(str(backlog))
        for _ in range(50):  # until new transitions arrive (at once, unless it is stuck)
            restored.train()
            (after,) = on_learner(restored, lambda learner: learner.status())
            if after["ingested"] > ingested:
                break
        assert after["ingested"] > ingested
        assert after["updates"] >= caught_up
    finally:
        restored.stop()


def test_the_update_is_split_where_a_lone_cpu_learner_has_two_cores_or_where_asked():
    from raylab.algorithms.sac.learner import split_update_on

    assert split_update_on(None, cuda=False, world=1, cores=2)
    assert not split_update_on(None, cuda=False, world=1, cores=1)
    assert not split_update_on(None, cuda=True, world=1, cores=8)
    assert not split_update_on(None, cuda=False, world=2, cores=8)  # all-reduced: fused
    assert split_update_on(True, cuda=False, world=1, cores=1)
    assert not split_update_on(False, cuda=False, world=1, cores=2)


@pytest.mark.parametrize(
    "override, message",
    [
        ("resources.num_learners=2", "algo.split_update=true needs one Learner"),
        ("resources.num_gpus_per_learner=1", "algo.split_update=true is for CPU Learners"),
    ],
)
def test_split_update_is_refused_where_the_fused_step_must_run(override, message):
    from raylab.config import compose
    from raylab.errors import UserError

    with pytest.raises(UserError, match=message):
        compose("sac", "Pendulum-v1", "mujoco", ["algo.split_update=true", override])
    # the defaults (one Learner, the GPU count left to the machine) take it
    assert compose("sac", "Pendulum-v1", "mujoco", ["algo.split_update=true"]).algo.split_update
