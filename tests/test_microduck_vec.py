"""The batched Microduck env: threads, autoreset, seeding, model isolation, infos, bad input."""

from __future__ import annotations

import os
from dataclasses import fields

import gymnasium as gym
import mujoco
import numpy as np
import pytest
from gymnasium.wrappers.vector import DictInfoToList

import raylab.envs  # noqa: F401  (registers the ids)
from raylab.envs.core.backend import model_bytes, owned_envs, thread_limit
from raylab.envs.core.managers import reward_tag, termination_tag
from raylab.envs.core.vec_env import nominal_physics
from raylab.envs.reference.microduck_balance import MicroduckBalanceEnv
from raylab.envs.robots.microduck import (
    apply_physics_params,
    load_model,
    prototype,
    robot_index,
)
from raylab.envs.tasks.microduck_balance import (
    MicroduckBalanceConfig,
    MicroduckBalanceVecEnv,
    balance_options,
    rewards,
)


def _reward_table(version: str):
    return rewards(balance_options({"reward_version": version}))


GYM_ID = "raylab/MicroduckBalance-v0"


def _actions(steps, n, seed=0, amplitude=1.0):
    return np.random.default_rng(seed).uniform(-amplitude, amplitude, size=(steps, n, 14))


def _rollout(env, actions, seed):
    obs, _ = env.reset(seed=seed)
    out = {"obs": [obs], "rew": [], "term": [], "trunc": [], "final_obs": []}
    for a in actions:
        obs, r, te, tr, info = env.step(a)
        out["obs"].append(obs)
        out["rew"].append(r)
        out["term"].append(te)
        out["trunc"].append(tr)
        if "final_obs" in info:
            out["final_obs"].append((info["final_obs"].copy(), info["_final_obs"].copy()))
    return {k: v if k == "final_obs" else np.array(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# Threads and sequential equality
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_thread_count_never_changes_a_bit(mode):
    n, actions = 6, _actions(300, 6, seed=1, amplitude=0.5)
    runs = []
    for t in (1, 2, 4):
        env = MicroduckBalanceVecEnv(
            num_envs=n,
            num_threads=t,
            allow_overcommit=True,
            autoreset_mode=mode,
            domain_randomization=True,
        )
        runs.append(_rollout(env, actions, seed=11))
        env.close()
    base = runs[0]
    assert base["trunc"].sum() == n  # every env ended one episode inside the 300 steps
    if mode == "same_step":
        assert len(base["final_obs"]) == 1 and base["final_obs"][0][1].all()
    for other in runs[1:]:
        for k in ("obs", "rew", "term", "trunc"):
            assert np.array_equal(base[k], other[k]), k
        assert len(base["final_obs"]) == len(other["final_obs"])
        for (fa, ma), (fb, mb) in zip(base["final_obs"], other["final_obs"]):
            assert np.array_equal(fa, fb) and np.array_equal(ma, mb)


def test_env_i_always_runs_on_thread_i_mod_t():
    assert owned_envs(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert owned_envs(2, 4) == [[0], [1]]


@pytest.mark.parametrize("history", [0, 3], ids=["plain", "obs_history"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_threaded_envs_equal_sequential_reference_envs_through_autoreset(mode, history):
    n, seed, steps = 3, 21, 300
    actions = _actions(steps, n, seed=2, amplitude=0.4)
    opts = {"reward_version": "v1", "latency_steps": 1, "sensor_noise": True}
    if history:  # the history sits between the policy's entries and the privileged ones
        opts.update(obs_history=history, privileged_obs=True)
    vec = MicroduckBalanceVecEnv(num_envs=n, num_threads=2, autoreset_mode=mode, **opts)
    got = _rollout(vec, actions, seed)
    vec.close()

    refs = [MicroduckBalanceEnv(**opts) for _ in range(n)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(refs)]
    assert np.array_equal(np.stack(obs), got["obs"][0])
    done = [False] * n
    finals = []
    for t in range(steps):
        row_obs, row_rew, final = [], [], {}
        for i, e in enumerate(refs):
            if mode == "next_step" and done[i]:
                o, _ = e.reset()
                r, te, tr = 0.0, False, False
            else:
                o, r, te, tr, _ = e.step(actions[t, i])
                if mode == "same_step" and (te or tr):
                    final[i] = o
                    o, _ = e.reset()
            done[i] = te or tr
            row_obs.append(o)
            row_rew.append(r)
        assert np.array_equal(np.stack(row_obs), got["obs"][t + 1]), t
        assert np.array_equal(np.array(row_rew), got["rew"][t]), t
        if final:
            finals.append(final)
    if mode == "same_step":
        assert len(finals) == len(got["final_obs"]) == 1
        final_obs, mask = got["final_obs"][0]
        assert mask.tolist() == [True] * n
        for i, o in finals[0].items():
            assert np.array_equal(final_obs[i], o)


def test_same_step_final_obs_is_the_next_step_truncation_obs():
    actions = _actions(251, 2, seed=3, amplitude=0.3)
    runs = {}
    for mode in ("next_step", "same_step"):
        env = MicroduckBalanceVecEnv(num_envs=2, autoreset_mode=mode, info_mode="full")
        runs[mode] = _rollout(env, actions, seed=5)
        env.close()
    nxt, same = runs["next_step"], runs["same_step"]
    assert np.array_equal(nxt["obs"][:250], same["obs"][:250])
    assert nxt["trunc"][249].all() and same["trunc"][249].all()
    assert np.array_equal(same["final_obs"][0][0], nxt["obs"][250])  # the final observation
    assert np.array_equal(same["obs"][250], nxt["obs"][251])  # then the new episode's first
    assert (nxt["rew"][250] == 0).all()  # next_step: the reset step has reward 0


# ---------------------------------------------------------------------------------------------
# Seeding and replay
# ---------------------------------------------------------------------------------------------


def test_seed_s_gives_env_i_the_reference_episode_of_seed_s_plus_i():
    vec = MicroduckBalanceVecEnv(num_envs=3, info_mode="full", domain_randomization=True)
    obs, info = vec.reset(seed=40)
    for i in range(3):
        ref = MicroduckBalanceEnv(domain_randomization=True)
        o, ref_info = ref.reset(seed=40 + i)
        assert np.array_equal(o, obs[i])
        assert ref_info["episode_params"].to_dict() == info["episode_params"][i].to_dict()
    vec.close()


def test_reset_replays_episode_params_per_env():
    vec = MicroduckBalanceVecEnv(num_envs=2, info_mode="full", num_pushes=4)
    obs, info = vec.reset(seed=1)
    params = list(info["episode_params"])
    swapped = [params[1], params[0].to_dict()]  # dicts from to_dict() are accepted too
    obs2, info2 = vec.reset(options={"episode_params": swapped})
    assert np.array_equal(obs2[0], obs[1]) and np.array_equal(obs2[1], obs[0])
    np.testing.assert_array_equal(info2["episode_params"][1].push_steps, params[0].push_steps)
    with pytest.raises(ValueError, match="2 envs"):
        vec.reset(options={"episode_params": params[:1]})
    vec.close()


def test_draws_are_within_the_documented_ranges():
    env = MicroduckBalanceEnv(domain_randomization=True, num_pushes=3)
    r = env.robot
    for s in range(20):
        p = env.reset(seed=s)[1]["episode_params"]
        assert len(set(p.push_steps.tolist())) == 3
        assert p.push_steps.min() >= 25 and p.push_steps.max() <= 225
        speed = np.hypot(p.push_vel[:, 0], p.push_vel[:, 1])
        assert np.all((speed >= 0.15 - 1e-12) & (speed <= 0.45 + 1e-12))
        q = p.qpos[r.qpos_adr]
        assert np.all(q >= r.lower) and np.all(q <= r.upper)  # noise clamped to the limits
        assert 0 <= p.latency <= 2 and 0.02 <= p.init_noise <= 0.3 and p.sensor_noise
        assert np.all((p.domain.mass_scale[1:] >= 0.85) & (p.domain.mass_scale[1:] <= 1.15))
        assert 0.6 <= p.domain.friction_scale <= 1.2


# ---------------------------------------------------------------------------------------------
# Model isolation and domain randomisation
# ---------------------------------------------------------------------------------------------


def test_domain_randomisation_applied_then_restored_leaves_the_model_byte_identical():
    m = load_model()
    before = model_bytes(m)
    nominal = nominal_physics(m)
    robot = robot_index()
    env = MicroduckBalanceEnv(domain_randomization=True)
    for s in range(3):
        p = env.reset(seed=s)[1]["episode_params"]
        apply_physics_params(m, nominal, robot, p.domain)
        assert model_bytes(m) != before
    apply_physics_params(m, nominal, robot, None)
    assert model_bytes(m) == before


def test_nothing_compounds_across_episodes_in_the_batched_env():
    vec = MicroduckBalanceVecEnv(num_envs=2, info_mode="full", domain_randomization=True)
    _, info = vec.reset(seed=3)
    p = list(info["episode_params"])
    once = [model_bytes(m) for m in vec.sim.models]
    for s in range(4):  # other DR episodes in between, with stepping and autoreset
        vec.reset(seed=100 + s)
        for a in _actions(5, 2, seed=s):
            vec.step(a)
    vec.reset(options={"episode_params": p})
    assert [model_bytes(m) for m in vec.sim.models] == once
    for q in p:
        q.domain = None
    vec.reset(options={"episode_params": p})
    proto = model_bytes(prototype())
    assert all(model_bytes(m) == proto for m in vec.sim.models)
    vec.close()


def test_mutating_one_envs_masses_leaves_the_others_and_the_prototype_untouched():
    vec = MicroduckBalanceVecEnv(num_envs=3)
    proto = model_bytes(prototype())
    vec.sim.models[1].body_mass[:] *= 3.0
    assert model_bytes(vec.sim.models[0]) == proto
    assert model_bytes(vec.sim.models[2]) == proto
    assert model_bytes(prototype()) == proto
    assert model_bytes(vec.sim.models[1]) != proto
    vec.close()


# ---------------------------------------------------------------------------------------------
# Threads limit and bad input
# ---------------------------------------------------------------------------------------------


def test_thread_counts_above_the_limit_are_refused_unless_overcommit():
    limit = thread_limit()
    assert limit == min(8, os.cpu_count())
    with pytest.raises(
        ValueError, match=rf"num_threads={limit + 1} .*limit of {limit}.*allow_overcommit"
    ):
        MicroduckBalanceVecEnv(num_envs=2, num_threads=limit + 1)
    with pytest.raises(ValueError, match="num_threads=9"):
        MicroduckBalanceVecEnv(num_envs=2, num_threads=9)
    with pytest.raises(ValueError, match="num_threads=0"):
        MicroduckBalanceVecEnv(num_envs=2, num_threads=0)
    env = MicroduckBalanceVecEnv(num_envs=2, num_threads=limit + 1, allow_overcommit=True)
    assert env.num_threads == limit + 1
    env.close()


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((2, 13)), r"shape \(2, 14\)"),
        (np.zeros(14), r"shape \(2, 14\)"),
        (np.where(np.eye(2, 14) > 0, np.nan, 0.0), r"NaN or Inf in env\(s\) \[0, 1\]"),
        (
            np.where(np.arange(28).reshape(2, 14) == 20, np.inf, 0.0),
            r"NaN or Inf in env\(s\) \[1\]",
        ),
    ],
)
def test_bad_batched_actions_raise_a_clear_error(bad, match):
    env = MicroduckBalanceVecEnv(num_envs=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(bad)
    env.close()


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros(13), r"shape \(14,\)"),
        (np.full(14, np.nan), "NaN or Inf"),
        ([np.inf] + [0.0] * 13, "NaN or Inf"),
    ],
)
def test_bad_reference_actions_raise_a_clear_error(bad, match):
    env = MicroduckBalanceEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(bad)


def test_out_of_range_actions_are_clipped_and_counted_identically():
    ref = MicroduckBalanceEnv()
    vec = MicroduckBalanceVecEnv(num_envs=1)
    ref.reset(seed=9)
    vec.reset(seed=9)
    a = np.zeros(14)
    a[[0, 5, 13]] = [1.7, -3.0, 1.0]
    o_ref = ref.step(a)[0]
    o_vec = vec.step(a[None])[0][0]
    assert np.array_equal(o_ref, o_vec)
    assert o_ref[28 + 0] == 1.0 and o_ref[28 + 5] == -1.0  # the action channel holds the clip
    assert ref.action_clip_count == vec.action_clip_count == 2
    vec.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"reward_version": "v3"}, r"unknown reward_version 'v3'; valid choices: v1, v2"),
        ({"variant": "wings"}, r"unknown variant 'wings'; valid choices: default, backlash, toes"),
        (
            {"autoreset_mode": "never"},
            r"unknown autoreset_mode 'never'; valid choices: next_step, same_step",
        ),
        ({"info_mode": "some"}, r"unknown info_mode 'some'; valid choices: none, full"),
        ({"latency_steps": 3}, r"latency_steps=3 is invalid; valid range: 0..2"),
        ({"num_pushes": 500}, r"num_pushes=500 does not fit"),
        ({"push_scale_end": 4.0}, r"push_scale_end=4.0 is invalid; valid range: 0..3.0"),
        ({"push_curriculum_steps": -1}, r"push_curriculum_steps=-1 is invalid"),
        ({"obs_history": 9}, r"obs_history=9 is invalid; valid range: 0..8"),
        (
            {"rew_height": float("nan")},
            r"rew_height=nan is invalid; a reward weight must be finite",
        ),
    ],
)
def test_bad_options_raise_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        gym.make_vec(GYM_ID, num_envs=2, vectorization_mode="vector_entry_point", **kwargs)
    assert "\n" not in str(e.value)
    if "autoreset_mode" not in kwargs and "info_mode" not in kwargs:
        with pytest.raises(ValueError, match=match):
            gym.make(GYM_ID, **kwargs)


def test_reward_weights_are_options_over_the_reward_versions_weights():
    """rew_<term> = null takes the version's weight; a number replaces it, adds a term the
    version does not have (in REWARD_TERMS order) or, at 0, leaves the term out."""
    table = lambda **o: [(t.name, t.weight) for t in rewards(balance_options(o))]  # noqa: E731
    assert table() == [
        ("upright", 1.0),
        ("height", 1.0),
        ("action_rate", -0.05),
        ("joint_vel", -0.042),
    ]
    assert [n for n, _ in table(reward_version="v1")] == [
        "upright", "height", "posture", "action_rate", "joint_vel", "effort"
    ]  # fmt: skip
    assert table(rew_posture=-0.1, rew_height=0.0, rew_upright=2.0) == [
        ("upright", 2.0), ("posture", -0.1), ("action_rate", -0.05), ("joint_vel", -0.042)
    ]  # fmt: skip
    # v1 swaps in its Gaussian height term; the weight option is the same.
    heights = {
        v: rewards(balance_options({"reward_version": v}))[1].fn.__name__ for v in ("v1", "v2")
    }
    assert heights == {"v1": "height_gaussian", "v2": "height_linear"}
    # The weights reach the env: the logged terms are the table's, and each is weight x raw.
    vec = MicroduckBalanceVecEnv(num_envs=2, num_pushes=0, info_mode="full", rew_posture=-0.1)
    vec.reset(seed=0)
    _, rew, *_, info = vec.step(np.full((2, 14), 0.5))
    assert list(info["reward_terms"]) == [
        "upright",
        "height",
        "posture",
        "action_rate",
        "joint_vel",
    ]
    np.testing.assert_array_equal(sum(info["reward_terms"].values()), rew)
    assert (info["reward_terms"]["posture"] < 0).all()
    vec.close()


def test_unknown_option_names_are_refused():
    with pytest.raises(TypeError, match="unknown option.*reward_versoin.*valid options"):
        MicroduckBalanceEnv(reward_versoin="v1")


# ---------------------------------------------------------------------------------------------
# Gymnasium and RLlib interface
# ---------------------------------------------------------------------------------------------


def test_every_config_field_is_an_env_option_with_the_same_default():
    skip = {"gym_id", "num_envs", "kwargs"}
    cfg = {f.name: f.default for f in fields(MicroduckBalanceConfig) if f.name not in skip}
    # Both envs read their options into the config dataclass itself: one set of defaults.
    assert balance_options({}) == MicroduckBalanceConfig(gym_id="")
    vec = gym.make_vec(GYM_ID, num_envs=2, vectorization_mode="vector_entry_point", **cfg)
    assert isinstance(vec, MicroduckBalanceVecEnv)
    vec.close()
    single = gym.make(GYM_ID, **cfg)
    assert isinstance(single.unwrapped, MicroduckBalanceEnv)


def test_make_vec_entry_point_under_dict_info_to_list_rllib_style():
    vec = gym.make_vec(
        GYM_ID,
        num_envs=3,
        vectorization_mode="vector_entry_point",
        num_threads=2,
        episode_steps=30,
        num_pushes=0,
    )
    assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    assert vec.single_observation_space.shape == (48,)
    assert vec.action_space.shape == (3, 14)
    env = DictInfoToList(vec)
    obs, infos = env.reset(seed=0)
    assert obs.shape == (3, 48) and obs.dtype == np.float32 and infos == [{}, {}, {}]
    for _ in range(35):  # through one autoreset
        obs, rew, term, trunc, infos = env.step(env.action_space.sample())
        assert infos == [{}, {}, {}] and rew.dtype == np.float64
    log = vec.unwrapped.pop_log()
    assert log[termination_tag("time_out")] == 3
    assert set(log) == {reward_tag(t.name) for t in _reward_table("v2")} | {
        termination_tag("time_out")
    }
    vec.close()


def test_same_step_infos_pass_dict_info_to_list():
    vec = gym.make_vec(
        GYM_ID,
        num_envs=2,
        vectorization_mode="vector_entry_point",
        autoreset_mode="same_step",
        episode_steps=5,
        num_pushes=0,
    )
    assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    env = DictInfoToList(vec)
    env.reset(seed=0)
    for _ in range(5):
        _, _, _, trunc, infos = env.step(np.zeros((2, 14)))
    assert trunc.all()
    assert all(info["final_obs"].shape == (48,) for info in infos)
    vec.close()


def test_full_infos_and_pop_log_agree_with_the_per_term_rewards():
    n = 4
    vec = MicroduckBalanceVecEnv(
        num_envs=n, info_mode="full", reward_version="v1", episode_steps=20, num_pushes=0
    )
    obs, info = vec.reset(seed=0)
    assert len(info["episode_params"]) == n
    sums = {t.name: 0.0 for t in _reward_table("v1")}
    steps = 0
    for a in _actions(21, n, seed=4, amplitude=0.5):  # 20 steps, then the NEXT_STEP reset step
        obs, rew, term, trunc, info = vec.step(a)
        stepped = info["step"] > 0
        np.testing.assert_array_equal(sum(info["reward_terms"].values()), rew)  # terms add up
        assert set(info) >= {
            "trunk_height",
            "upright_cos",
            "fallen",
            "pushed",
            "step",
            "reward_terms",
            "log",
        }
        for t, v in info["reward_terms"].items():
            sums[t] += v[stepped].sum()
            if stepped.any():
                assert info["log"][reward_tag(t)] == pytest.approx(v[stepped].mean())
        steps += int(stepped.sum())
    assert (info["step"] == 0).all() and (rew == 0).all()  # the last call reset every env
    log = vec.pop_log()
    for t in (term.name for term in _reward_table("v1")):
        assert log[reward_tag(t)] == pytest.approx(sums[t] / steps)
    assert log[termination_tag("time_out")] == n
    assert steps == 20 * n
    assert vec.pop_log() == {termination_tag("time_out"): 0}  # cleared
    vec.close()


def test_reference_env_info_has_the_terms_and_flags():
    env = gym.make(GYM_ID, reward_version="v1")
    obs, info = env.reset(seed=0)
    assert obs.shape == (48,) and obs.dtype == np.float32
    assert set(info) >= {"episode_params", "trunk_height", "upright_cos", "fallen", "step"}
    total = 0.0
    for t in range(250):
        obs, r, term, trunc, info = env.step(np.zeros(14, dtype=np.float32))
        assert sum(info["reward_terms"].values()) == pytest.approx(r)
        assert set(info["reward_terms"]) == {term.name for term in _reward_table("v1")}
        assert term is False and trunc == (t == 249)
        total += r
        assert r <= 2.0
    assert info["step"] == 250
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(14))


def test_step_before_reset_is_refused():
    vec = MicroduckBalanceVecEnv(num_envs=1)
    with pytest.raises(RuntimeError, match="reset"):
        vec.step(np.zeros((1, 14)))
    vec.close()
    assert mujoco.mj_versionString()  # the real engine is what ran


def test_episode_survival_stats():
    vec = MicroduckBalanceVecEnv(num_envs=3, episode_steps=30, num_pushes=0, info_mode="full")
    vec.reset(seed=0)
    heights = []
    for _ in range(30):
        info = vec.step(np.zeros((3, 14)))[4]
        heights.append(info["trunk_height"])
    stats = vec.pop_episode_stats()
    assert stats["episodes"] == 3 and stats["survival"] == 1.0
    assert stats["trunk_height"] == pytest.approx(np.mean(heights))
    assert vec.pop_episode_stats() == {"episodes": 0}
    vec.close()


def test_step_times_are_the_parts_of_each_step():
    import time

    env = MicroduckBalanceVecEnv(num_envs=4, episode_steps=5, num_pushes=0)
    env.reset(seed=0)
    assert env.pop_step_times() == ({p: 0.0 for p in env.STEP_PARTS}, 0)
    t0 = time.perf_counter()
    for _ in range(12):  # two autoresets on the way
        env.step(np.zeros((4, 14)))
    wall_ms = (time.perf_counter() - t0) * 1000.0
    means, steps = env.pop_step_times()
    assert steps == 12 and set(means) == set(env.STEP_PARTS)
    assert all(v >= 0.0 for v in means.values()) and means["backend_step"] > 0.0
    assert sum(means.values()) * steps <= wall_ms
    assert env.pop_step_times()[1] == 0  # cleared
    env.close()


def test_baselines_hold_pose_beats_random():
    from raylab.bench.baselines import run_baselines

    b = run_baselines(episodes=3, seeds=(0,), num_threads=1, episode_steps=30, num_pushes=0)
    hold, rand = b["v2/hold_pose"], b["v2/random"]
    assert hold["return_mean_over_seeds"] > 0.95 * 2 * 30  # standing still scores ~2 per step
    assert hold["survival"] == 1.0 and hold["upright_at_end"] == 1.0
    assert rand["return_mean_over_seeds"] < hold["return_mean_over_seeds"]


# ------------------------------------------------------------------ post-step sensor pass


@pytest.mark.parametrize("variant", ["default", "backlash", "toes"])
def test_balance_models_use_the_sensor_pass_and_it_equals_mj_forward(variant):
    """The batched env evaluates Microduck's sensors with the partial forward pass; on post-step
    states under random controls and kicks, it writes the same bits as a full mj_forward."""
    from raylab.envs.core.backend import sensor_pass, sensor_pass_applies

    m = prototype(variant)
    assert sensor_pass_applies(m)
    env = MicroduckBalanceVecEnv(num_envs=2, num_threads=1, variant=variant)
    try:
        assert env.sim.post_step is sensor_pass
    finally:
        env.close()
    d, full = mujoco.MjData(m), mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, 0)
    rng = np.random.default_rng(7)
    for t in range(200):
        d.ctrl[:] = m.key_ctrl[0] + rng.uniform(-0.6, 0.6, m.nu)
        if t % 50 == 10:
            d.qvel[:6] += rng.normal(0, 0.5, 6)  # a push
        mujoco.mj_step(m, d, 10)
        mujoco.mj_copyData(full, m, d)
        sensor_pass(m, d)
        mujoco.mj_forward(m, full)
        assert np.array_equal(d.sensordata, full.sensordata), t
        # ... and the trajectory does not depend on which evaluation ran.
        assert np.array_equal(d.qacc_warmstart, full.qacc_warmstart)


def test_models_with_contact_sensors_keep_the_full_forward_pass():
    import raylab.envs.tasks.go2 as go2
    import raylab.envs.tasks.microduck_joystick as mj
    from raylab.envs.core.backend import BatchedMujoco, sensor_pass_applies

    for proto in (go2.prototype(), mj.prototype()):
        assert any(t == mujoco.mjtSensor.mjSENS_TOUCH for t in proto.sensor_type)
        assert not sensor_pass_applies(proto)
        sim = BatchedMujoco(proto, num_envs=1)
        try:
            assert sim.post_step is mujoco.mj_forward
        finally:
            sim.close()


def test_the_sensor_pass_misses_what_only_mj_forward_computes():
    """A touch sensor reads the constraint forces: the sensor pass would leave it stale, which is
    why models with one are not given it (this test fails if that ever stops being true)."""
    import raylab.envs.tasks.go2 as go2
    from raylab.envs.core.backend import sensor_pass

    m = go2.prototype()
    d, full = mujoco.MjData(m), mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, 0)
    mujoco.mj_step(m, d, 200)  # standing: the feet press on the floor
    d.qvel[:3] += 0.5
    mujoco.mj_step(m, d, 10)
    mujoco.mj_copyData(full, m, d)
    sensor_pass(m, d)
    mujoco.mj_forward(m, full)
    touch = [j for j in range(m.nsensor) if m.sensor_type[j] == mujoco.mjtSensor.mjSENS_TOUCH]
    adr = [m.sensor_adr[j] for j in touch]
    assert not np.array_equal(d.sensordata[adr], full.sensordata[adr])


# ---------------------------------------------------------------------------------------------
# Training-only options: termination on a fall, the push curriculum
# ---------------------------------------------------------------------------------------------


def test_fall_termination_ends_fallen_episodes_identically_in_both_envs():
    """With fall_termination the step the duck is down is `terminated` (and counted as
    Episode_Termination/fallen); the reference env ends the same episodes on the same steps.
    Pushes twice the task's strongest and zero action make some ducks fall."""
    n, seed, steps = 6, 3, 250
    opts = {"fall_termination": True, "push_scale_end": 2.0}
    actions = np.zeros((steps, n, 14))
    vec = MicroduckBalanceVecEnv(num_envs=n, num_threads=1, autoreset_mode="same_step", **opts)
    got = _rollout(vec, actions, seed)
    log = vec.pop_log()
    vec.close()
    assert got["term"].any(), "no duck fell: the test pushes too weakly"
    assert log[termination_tag("fallen")] == int(got["term"].sum())
    for i in range(n):
        ref = MicroduckBalanceEnv(**opts)
        ref.reset(seed=seed + i)
        for t in range(steps):
            _, _, te, tr, info = ref.step(actions[t, i])
            assert te == got["term"][t, i], (i, t)
            assert te == info["fallen"] or not te
            if te or tr:
                ref.reset()
    # Without the option (the task as defined) the same episodes only ever truncate.
    plain = MicroduckBalanceVecEnv(num_envs=n, num_threads=1, push_scale_end=2.0)
    assert not _rollout(plain, actions, seed)["term"].any()
    plain.close()


def test_push_curriculum_scales_the_drawn_push_speeds_and_nothing_else():
    from raylab.envs.tasks.microduck_balance import push_scale

    o = balance_options({"push_curriculum_steps": 1000, "push_scale_start": 0.2})
    assert [push_scale(o, s) for s in (0, 500, 1000, 5000)] == pytest.approx([0.2, 0.6, 1.0, 1.0])
    assert push_scale(balance_options({"push_scale_end": 1.5}), 0) == 1.5
    assert push_scale(balance_options({}), 10**9) == 1.0

    def first_params(env_steps, **opts):
        ref = MicroduckBalanceEnv(**opts)
        ref.env_steps = env_steps
        return ref.reset(seed=7)[1]["episode_params"]

    task = first_params(0)
    start = first_params(0, push_curriculum_steps=1000, push_scale_start=0.2)
    half = first_params(500, push_curriculum_steps=1000, push_scale_start=0.2)
    assert np.allclose(start.push_vel, 0.2 * task.push_vel)
    assert np.allclose(half.push_vel, 0.6 * task.push_vel)
    # The same draws otherwise: push steps, initial joints, the noise seed.
    assert np.array_equal(half.push_steps, task.push_steps)
    assert np.array_equal(half.qpos, task.qpos) and half.noise_seed == task.noise_seed

    # The batched env counts the steps of all its envs and scales the episodes it resets.
    vec = MicroduckBalanceVecEnv(
        num_envs=4, num_threads=1, push_curriculum_steps=400, push_scale_start=0.0, info_mode="full"
    )
    _, info = vec.reset(seed=7)
    assert all(np.all(p.push_vel == 0.0) for p in info["episode_params"])
    for _ in range(250):
        _, _, _, _, info = vec.step(np.zeros((4, 14)))
    _, _, _, _, info = vec.step(np.zeros((4, 14)))  # the autoreset: 1000 steps in, factor 1
    assert vec.env_steps == 1000
    assert all(np.any(p.push_vel != 0.0) for p in info["episode_params"])
    vec.close()


def test_evaluation_runs_the_training_only_options_at_their_defaults():
    from raylab.algorithms.build import build_algorithm_config, env_options
    from raylab.config import compose

    cfg = compose(
        "appo",
        "microduck_balance",
        overrides=[
            "env.fall_termination=true",
            "env.push_curriculum_steps=1000",
            "env.push_scale_end=1.3",
        ],
    )
    train, evaluation = env_options(cfg), env_options(cfg, evaluation=True)
    assert train["fall_termination"] and train["push_scale_end"] == 1.3
    task = {
        "fall_termination": False,
        "push_curriculum_steps": 0,
        "push_scale_start": 0.0,
        "push_scale_end": 1.0,
    }
    assert evaluation == {**train, **task}
    config = build_algorithm_config(cfg)
    assert config.env_config["fall_termination"] is True
    # What RLlib's evaluation EnvRunner gets (it merges evaluation_config into the config).
    eval_env = config.get_evaluation_config_object().env_config
    assert {k: eval_env[k] for k in task} == task


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_obs_history_holds_the_previous_observations_newest_first(mode):
    """obs_history=k: [current 48, previous k observations' 48 each, privileged 4]; at the
    start of an episode the history is the first observation k times."""
    k, d = 2, 48
    vec = MicroduckBalanceVecEnv(
        num_envs=2,
        obs_history=k,
        privileged_obs=True,
        episode_steps=30,
        num_pushes=0,
        autoreset_mode=mode,
    )
    assert vec.single_observation_space.shape == (d * (1 + k) + 4,)
    assert vec.actor_obs_dim == d * (1 + k)

    def parts(o):
        return o[:, :d], [o[:, d * (j + 1) : d * (j + 2)] for j in range(k)], o[:, d * (1 + k) :]

    obs, _ = vec.reset(seed=3)
    now, past, _ = parts(obs)
    assert all(np.array_equal(p, now) for p in past)
    episodes = [[now[i]] for i in range(2)]  # each env's observations since its episode began
    actions = _actions(40, 2, seed=1, amplitude=0.3)
    for t in range(40):
        obs, _, term, trunc, _ = vec.step(actions[t])
        now, past, priv = parts(obs)
        starts = vec.step_count == 0 if mode == "next_step" else (term | trunc)
        for i in range(2):
            if starts[i]:
                episodes[i] = []
            seen = episodes[i]
            for j in range(k):  # the j-th newest earlier one; the first one at the start
                expected = seen[max(len(seen) - 1 - j, 0)] if seen else now[i]
                assert np.array_equal(past[j][i], expected), (t, i, j)
            seen.append(now[i])
        assert np.array_equal(priv[:, 3], vec.trunk_height.astype(np.float32))
    vec.close()


def test_the_push_table_blames_each_first_fall_on_the_last_push_before_it():
    """run_policy_episodes' push table, checked against the episodes themselves: replayed one
    at a time in a batched env, each episode's first fall and its pushes (from the reset's
    episode_params) give the same counts per speed bin."""
    from raylab.algorithms.evaluation import (
        PUSH_BIN,
        eval_vec_env,
        hold_pose_policy,
        run_policy_episodes,
    )

    episodes, seed = 12, 1000
    env = eval_vec_env(GYM_ID, {"num_threads": 1}, 6, True)
    stats = run_policy_episodes(hold_pose_policy(env.single_action_space), env, episodes, seed)
    env.close()
    expected, unpushed = {}, 0
    one = eval_vec_env(GYM_ID, {"num_threads": 1}, 1, True)
    for k in range(episodes):
        _, info = one.reset(seed=seed + k)
        p = info["episode_params"][0]
        fell, t, done = -1, 0, False
        while not done:
            _, _, term, trunc, info = one.step(np.zeros((1, 14)))
            t += 1
            if fell < 0 and info["fallen"][0]:
                fell = t
            done = bool(term[0] or trunc[0])
        hit = [(int(s), float(np.hypot(*v))) for s, v in zip(p.push_steps, p.push_vel)]
        hit = [(s, v) for s, v in hit if fell < 0 or s < fell]
        unpushed += int(fell >= 0 and not hit)
        for s, v in hit:
            row = expected.setdefault(int(np.floor(v / PUSH_BIN + 1e-9)), [0, 0])
            row[0] += 1
            row[1] += int(fell >= 0 and s == max(hit)[0])
    one.close()
    got = {round(r["speed"][0] / PUSH_BIN): [r["pushes"], r["felled"]] for r in stats["push_table"]}
    assert got == expected and stats["fell_unpushed"] == unpushed
    assert sum(n for n, _ in got.values()) >= episodes  # every episode pushed before a fall
    assert sum(k for _, k in got.values()) > 0  # holding the pose, some pushes fell the duck
