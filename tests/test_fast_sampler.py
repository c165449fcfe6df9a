"""raylab's rollout loop for batched envs against RLlib's own EnvRunner loop (real RLlib EnvRunners
and real MuJoCo, in this process), its selection, and env.num_threads=auto.

The end-to-end training runs of tests/test_train.py (PPO, APPO and SAC on microduck_balance) go
through the fast path by default: they are the check that RLlib's learners train on its output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from raylab.algorithms.build import build_algorithm_config, physics_threads, use_fast_sampler
from raylab.algorithms.env_runner import RaylabEnvRunner, RaylabFastEnvRunner
from raylab.algorithms.rollout import RolloutLoop, correlated_noise, env_actions
from raylab.config import compose
from raylab.envs.core.backend import MAX_THREADS
from raylab.envs.tasks.microduck_balance import MicroduckBalanceVecEnv
from raylab.errors import UserError

# Short episodes with one push, so a few hundred steps hold several autoresets.
SHORT = ["env.num_envs=4", "training.seed=3", "env.episode_steps=60", "env.num_pushes=1"]


def _runners(algo: str, task: str = "microduck_balance"):
    short = SHORT if task == "microduck_balance" else [o for o in SHORT if "push" not in o]
    if task == "Pendulum-v1":  # a Gymnasium id (Box actions in [-2, 2]), 60-step episodes
        short = ["env.num_envs=4", "training.seed=3", "env.kwargs.max_episode_steps=60"]
    cfg = compose(algo, task, overrides=short)
    config = build_algorithm_config(cfg).env_runners(rollout_fragment_length=32)
    fast = RaylabFastEnvRunner(config=config, worker_index=1)
    stock = RaylabEnvRunner(config=config, worker_index=1)
    stock.module.set_state(fast.module.get_state())  # the same weights
    return fast, stock


def _key(episode):
    return (episode.t_started, len(episode), episode.get_observations()[0].tobytes())


@pytest.mark.parametrize(
    "algo, task",
    [
        ("ppo", "microduck_balance"),
        ("appo", "microduck_balance"),
        ("ppo", "go2_joystick_flat"),
        ("ppo", "Pendulum-v1"),
    ],
)
def test_fast_path_equals_rllibs_loop_bit_for_bit_through_autoresets(algo, task):
    fast, stock = _runners(algo, task)
    finished = steps = 0
    for k in range(6):  # 6 x 128 transitions = 192 steps per env, 3 episodes each
        torch.manual_seed(100 + k)  # both sample actions from torch's global generator
        a = sorted(fast.sample(num_timesteps=128), key=_key)
        torch.manual_seed(100 + k)
        b = sorted(stock.sample(num_timesteps=128), key=_key)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            # Same chunks: where episodes begin and end, and every value, with ==.
            assert (x.t_started, len(x), x.is_terminated, x.is_truncated) == (
                y.t_started,
                len(y),
                y.is_terminated,
                y.is_truncated,
            )
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
            np.testing.assert_array_equal(x.get_actions(), y.get_actions())
            np.testing.assert_array_equal(x.get_rewards(), y.get_rewards())
            for column in (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS):
                np.testing.assert_array_equal(
                    x.get_extra_model_outputs(column), y.get_extra_model_outputs(column)
                )
            finished += x.is_done
            steps += len(x)
    assert steps == 6 * 128
    if task in ("microduck_balance", "Pendulum-v1"):
        assert finished == 12  # every env's 60-step episodes ended and autoreset three times
    else:
        assert finished >= 12  # the quadruped also terminates when it falls
    fast.stop(), stock.stop()


def test_fast_path_logs_the_same_episode_metrics_and_collector_phases():
    fast, stock = _runners("appo")
    for runner in (fast, stock):
        torch.manual_seed(0)
        runner.sample(num_timesteps=4 * 70)  # 70 steps per env: every env finishes one episode
    mf, ms = fast.get_metrics(), stock.get_metrics()
    value = lambda m, k: m[k].peek()  # noqa: E731  (RLlib's reduced Stats)
    for key in ("episode_return_mean", "episode_len_mean", "num_episodes", "num_env_steps_sampled"):
        assert value(mf, key) == pytest.approx(value(ms, key), rel=1e-9), key
    assert value(mf, "episode_len_mean") == 60 and value(mf, "num_episodes") == 4
    # The canonical collector phases, measured by the loop, travel as the collector tracker's
    # partial state (what the driver merges into Perf/collector_*).
    from raylab.metrics import schema as S
    from raylab.metrics.tracker import drop_counts, merge_exports

    merged = drop_counts(merge_exports(mf["raylab"]["collector"].peek()))
    for tag in (
        S.PERF_COLLECTOR_MLP_INFER_MS,
        S.PERF_COLLECTOR_ENV_STEP_MS,
        S.PERF_COLLECTION_TIME,
        S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS,
    ):
        assert merged[f"collector/{tag}"] > 0, tag
    assert merged[f"collector/{S.EPISODE_TIMEOUT_RATE}"] == 1.0
    fast.stop(), stock.stop()


def _lag1(z: np.ndarray) -> float:
    """Correlation of neighbouring rows of z (steps x entries)."""
    return float(np.corrcoef(z[:-1].ravel(), z[1:].ravel())[0, 1])


def test_correlated_noise_is_standard_normal_each_step_and_restarts_with_the_episode():
    torch.manual_seed(0)
    n, steps, rho = 256, 400, 0.9
    noise, rows = None, []
    for t in range(steps):
        new = np.zeros(n, dtype=bool)
        new[: n // 2] = t == 200  # half the envs start a new episode at step 200
        noise = correlated_noise(noise, new, rho, 3)
        rows.append(noise.numpy().copy())
    z = np.stack(rows)  # (steps, n, 3)
    assert z[1:].std() == pytest.approx(1.0, abs=0.02)  # every step's marginal: N(0, 1)
    assert _lag1(z[:, n // 2 :]) == pytest.approx(rho, abs=0.01)
    # Across the new episode's first step the noise starts over: no correlation there.
    across = np.corrcoef(z[199, : n // 2].ravel(), z[200, : n // 2].ravel())[0, 1]
    assert abs(across) < 0.15
    assert abs(_lag1(correlated_noise(None, np.zeros(4096, bool), rho, 2).numpy())) < 0.05


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_noise_correlation_option_smooths_the_fast_loops_exploration(rho):
    cfg = compose("appo", "microduck_balance", overrides=SHORT + [f"algo.noise_correlation={rho}"])
    config = build_algorithm_config(cfg).env_runners(rollout_fragment_length=32)
    runner = RaylabFastEnvRunner(config=config, worker_index=1)
    torch.manual_seed(0)
    zs = []
    for episode in runner.sample(num_timesteps=4 * 50):
        inputs = np.asarray(episode.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS))
        mean, log_std = np.split(inputs, 2, axis=-1)
        actions = np.asarray(episode.get_actions())
        zs.append((actions - mean) / np.exp(log_std))  # the noise each action was drawn with
        # The stored log-prob is the policy's Gaussian density of the action taken, what
        # APPO's importance ratio divides by.
        dist = torch.distributions.Normal(torch.tensor(mean), torch.tensor(np.exp(log_std)))
        logp = dist.log_prob(torch.tensor(actions)).sum(-1).numpy()
        np.testing.assert_allclose(
            episode.get_extra_model_outputs(Columns.ACTION_LOGP), logp, rtol=1e-4, atol=1e-4
        )
    lag1 = np.mean([_lag1(z) for z in zs])
    assert np.concatenate(zs).std() == pytest.approx(1.0, abs=0.1)
    assert lag1 == pytest.approx(rho, abs=0.1)
    runner.stop()


def test_rllib_loop_calls_in_between_make_the_fast_loop_start_over():
    fast, _ = _runners("ppo")
    fast.sample(num_timesteps=16)
    assert fast._loop is not None
    fast.sample(num_episodes=1, explore=False)  # evaluation-style: RLlib's loop resets the env
    assert fast._loop is None
    out = fast.sample(num_timesteps=16)
    assert all(e.t_started == 0 for e in out)  # fresh episodes after the reset
    fast.stop()


def test_rollout_loop_steps_min_transitions_and_bookkeeps_episodes():
    env = MicroduckBalanceVecEnv(num_envs=3, num_threads=1, episode_steps=10, num_pushes=0)
    loop = RolloutLoop(env)
    loop.reset(seed=0)
    rng = np.random.default_rng(0)
    frag = loop.run(
        None,
        random_action=lambda n: rng.uniform(-1, 1, (n, 14)).astype(np.float32),
        min_transitions=45,
        with_logp=False,
    )
    # 10-step episodes: step 10 of each env is its NEXT_STEP reset, not a transition.
    assert frag.valid.shape == (16, 3) and not frag.valid[10].any() and frag.valid[:10].all()
    assert frag.num_steps == 45
    assert [(i, length) for i, length, _, _ in frag.episodes] == [(0, 10), (1, 10), (2, 10)]
    for i, _, ret, truncated in frag.episodes:
        assert ret == pytest.approx(frag.rewards[:10, i].sum()) and truncated
    assert loop.ep_len.tolist() == [5, 5, 5]
    fixed = loop.run(
        None, random_action=lambda n: np.zeros((n, 14), np.float32), steps=4, with_logp=False
    )
    assert fixed.valid.shape == (4, 3)
    env.close()


def test_env_actions_are_rllibs_unsquash_and_clip():
    from gymnasium.spaces import Box
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    space = Box(-2.0, 3.0, (5,), np.float32)
    a = np.random.default_rng(1).normal(0, 1.5, (8, 5)).astype(np.float32)
    ours = env_actions(a, space.low, space.high)
    for row, mine in zip(a, ours):
        np.testing.assert_array_equal(unsquash_action(row, space), mine)


def test_the_fast_path_is_the_default_for_box_actions_and_a_switch_turns_it_off():
    appo = build_algorithm_config(compose("appo", "microduck_balance"))
    assert appo.env_runner_cls is RaylabFastEnvRunner
    off = compose("ppo", "microduck_balance", overrides=["training.fast_sampler=false"])
    assert (
        not use_fast_sampler(off) and build_algorithm_config(off).env_runner_cls is RaylabEnvRunner
    )
    # A Gymnasium id with Box actions too; discrete actions take RLlib's loop, and asking for
    # raylab's is refused.
    assert build_algorithm_config(compose("ppo", "Pendulum-v1")).env_runner_cls is (
        RaylabFastEnvRunner
    )
    assert build_algorithm_config(compose("ppo", "CartPole-v1")).env_runner_cls is (RaylabEnvRunner)
    with pytest.raises(UserError, match="needs continuous"):
        compose("ppo", "CartPole-v1", overrides=["training.fast_sampler=true"])
    with pytest.raises(UserError, match="SAC always samples"):
        compose("sac", "microduck_balance", overrides=["training.fast_sampler=false"])


def test_num_threads_auto_uses_the_cores_the_envrunner_may_use(monkeypatch):
    import raylab.algorithms.build as build

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(build, "usable_cores", lambda: 16)
    cfg = lambda algo, *o: compose(algo, "microduck_balance", overrides=list(o))  # noqa: E731
    assert physics_threads(cfg("appo")) == MAX_THREADS  # 16 cores, one EnvRunner: capped at 8
    assert physics_threads(cfg("appo", "resources.num_env_runners=4")) == 4
    assert physics_threads(cfg("ppo", "env.num_envs=2")) == 2  # one thread per env at most
    # SAC's learner computes all the time: its CPUs are left to it.
    assert (
        physics_threads(
            cfg("sac", "resources.num_env_runners=3", "resources.num_cpus_per_learner=4")
        )
        == 4
    )
    # On a cluster: the EnvRunner's own reservation, so EnvRunners sharing a node never
    # oversubscribe it.
    assert (
        physics_threads(
            cfg("appo", "resources.ray_address=auto", "resources.num_cpus_per_env_runner=3")
        )
        == 3
    )
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert physics_threads(cfg("appo")) == 1
    assert physics_threads(cfg("appo", "env.num_threads=2")) == 2  # a number is taken as given
    from raylab.algorithms.build import env_options

    assert env_options(cfg("appo", "env.num_threads=2"))["num_threads"] == 2
    with pytest.raises(UserError, match="env.num_threads=0: a positive integer or auto"):
        cfg("appo", "env.num_threads=0")
