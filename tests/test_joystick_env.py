"""The joystick tasks (go2_joystick_flat, microduck_joystick) on the batched backend."""

from __future__ import annotations

import json
from dataclasses import fields
from types import SimpleNamespace

import gymnasium as gym
import mujoco
import numpy as np
import pytest
from gymnasium.wrappers.vector import DictInfoToList

import raylab.envs  # noqa: F401  (registers the ids)
from raylab.algorithms.evaluation import eval_vec_env, hold_pose_policy, run_policy_episodes
from raylab.config import compose
from raylab.envs.core.managers import (
    REWARD_PREFIX,
    reward_tag,
    reward_weight_fields,
    termination_tag,
)
from raylab.envs.tasks import TASKS
from raylab.envs.tasks.go2 import Go2JoystickFlatConfig, Go2JoystickFlatEnv, Go2JoystickFlatVecEnv
from raylab.envs.tasks.legged_joystick import CONTROL_DT, REWARD_TERMS
from raylab.envs.tasks.microduck_balance import MicroduckBalanceVecEnv
from raylab.envs.tasks.microduck_joystick import (
    MicroduckJoystickConfig,
    MicroduckJoystickEnv,
    MicroduckJoystickVecEnv,
    gait_reference,
    prototype,
)

GO2 = "raylab/Go2JoystickFlat-v0"
DUCK = "raylab/MicroduckJoystick-v0"
VEC = {GO2: Go2JoystickFlatVecEnv, DUCK: MicroduckJoystickVecEnv}
CONFIG = {GO2: Go2JoystickFlatConfig, DUCK: MicroduckJoystickConfig}
SKIP = {"gym_id", "num_envs", "kwargs"}


def _vec(gym_id, n=4, **kw):
    return gym.make_vec(gym_id, num_envs=n, vectorization_mode="vector_entry_point", **kw)


def _rollout(env, actions, seed):
    obs, _ = env.reset(seed=seed)
    out = {"obs": [obs], "rew": [], "term": [], "trunc": [], "final": []}
    for a in actions:
        obs, r, te, tr, info = env.step(a)
        for k, v in (("obs", obs), ("rew", r), ("term", te), ("trunc", tr)):
            out[k].append(v)
        if "final_obs" in info:
            out["final"].append(info["final_obs"].copy())
    out = {k: np.array(v) for k, v in out.items()}
    out["log"] = env.unwrapped.pop_log()
    return out


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes, registration, options
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gym_id, obs_dim, act_dim", [(GO2, 49, 12), (DUCK, 51, 14)])
def test_shapes_and_dtypes(gym_id, obs_dim, act_dim):
    env = _vec(gym_id, n=3)
    assert isinstance(env, VEC[gym_id])
    assert env.single_observation_space.shape == (obs_dim,)
    assert env.single_action_space.shape == (act_dim,)
    obs, info = env.reset(seed=0)
    assert obs.shape == (3, obs_dim) and obs.dtype == np.float32 and info == {}
    obs, r, te, tr, info = env.step(np.zeros((3, act_dim), np.float32))
    assert obs.shape == (3, obs_dim) and obs.dtype == np.float32
    assert r.shape == (3,) and r.dtype == np.float64
    assert te.dtype == bool and tr.dtype == bool and info == {}
    env.close()
    single = gym.make(gym_id)
    o, _ = single.reset(seed=0)
    assert o.shape == (obs_dim,) and o.dtype == np.float32
    o, r, te, tr, i = single.step(np.zeros(act_dim))
    assert isinstance(r, float) and {"trunk_height", "command", "lin_vel", "reward_terms"} <= set(i)
    single.close()


def test_go2_observation_layout():
    env = Go2JoystickFlatVecEnv(num_envs=2)
    obs, _ = env.reset(seed=3)
    s = env.observations.slices
    assert [t.name for t in env.observations.terms] == [
        "gyro",
        "projected_gravity",
        "joint_pos",
        "joint_vel",
        "last_action",
        "command",
        "foot_phase",
    ]
    assert (s["gyro"], s["command"], s["foot_phase"]) == (slice(0, 3), slice(42, 45), slice(45, 49))
    np.testing.assert_array_equal(obs[:, s["command"]], env.command.astype(np.float32))
    np.testing.assert_allclose(obs[:, s["projected_gravity"]], env.gravity, atol=1e-6)
    # trot: FR with RL, FL with RR, half a period apart
    phase = obs[:, s["foot_phase"]]
    np.testing.assert_array_equal(phase[:, 0], phase[:, 3])
    np.testing.assert_array_equal(phase[:, 1], phase[:, 2])
    for _ in range(6):
        obs, *_ = env.step(np.zeros((2, 12)))
    phase = obs[:, s["foot_phase"]]
    np.testing.assert_allclose(phase[:, 0], np.sin(2 * np.pi * 6 * 2.0 * CONTROL_DT), atol=1e-6)
    np.testing.assert_allclose(phase[:, 1], -phase[:, 0], atol=1e-6)
    env.close()


def test_microduck_observation_is_the_48_balance_channels_then_command():
    """With pushes, noise and commands off, the first 48 channels are the balance env's bits."""
    n, rng = 2, np.random.default_rng(5)
    actions = rng.uniform(-1, 1, size=(60, n, 14))
    joy = MicroduckJoystickVecEnv(num_envs=n, init_noise=0.0, push_vel=0.0, command_zero_prob=1.0)
    bal = MicroduckBalanceVecEnv(num_envs=n, init_noise=0.0, num_pushes=0)
    a, _ = joy.reset(seed=1)
    b, _ = bal.reset(seed=1)
    assert a.shape == (n, 51)
    np.testing.assert_array_equal(a[:, :48], b)
    for act in actions:
        a, *_ = joy.step(act)
        b, *_ = bal.step(act)
        np.testing.assert_array_equal(a[:, :48], b)
        np.testing.assert_array_equal(a[:, 48:], 0.0)
    joy.close(), bal.close()
    gait = MicroduckJoystickVecEnv(num_envs=1, gait_freq_hz=1.5)
    assert gait.single_observation_space.shape == (53,)
    gait.close()


@pytest.mark.parametrize("gym_id", [GO2, DUCK])
def test_every_config_field_is_an_env_option(gym_id):
    cfg = {
        f.name: f.default if not callable(f.default_factory) else f.default_factory()
        for f in fields(CONFIG[gym_id])
        if f.name not in SKIP
    }
    env = _vec(gym_id, n=2, **cfg)
    for name, value in cfg.items():
        if name in ("num_threads", "autoreset_mode", "info_mode", "allow_overcommit"):
            continue
        assert getattr(env.unwrapped.opts, name) == value, name
    env.close()
    assert isinstance(gym.make(gym_id, **cfg).unwrapped, (Go2JoystickFlatEnv, MicroduckJoystickEnv))


def test_reward_weight_fields_are_exactly_the_reward_terms():
    for cls in (Go2JoystickFlatConfig, MicroduckJoystickConfig):
        names = [f[len(REWARD_PREFIX) :] for f in reward_weight_fields(cls)]
        assert names == list(REWARD_TERMS)


def test_tasks_compose_for_every_algorithm():
    for task in ("go2_joystick_flat", "microduck_joystick"):
        assert TASKS[task].gym_id in gym.registry
        for algo in ("ppo", "appo", "sac"):
            cfg = compose(
                algo, task, overrides=["env.rew_foot_slip=-0.5", "env.lin_vel_x=[-0.5,0.5]"]
            )
            assert cfg.env.rew_foot_slip == -0.5 and list(cfg.env.lin_vel_x) == [-0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"autoreset_mode": "later"},
            r"unknown autoreset_mode 'later'; valid choices: next_step, same_step",
        ),
        ({"info_mode": "some"}, r"unknown info_mode 'some'; valid choices: none, full"),
        (
            {"lin_vel_x": [1.0, -1.0]},
            r"lin_vel_x=\[1.0, -1.0\] is invalid; it must be \[low, high\]",
        ),
        ({"command_zero_prob": 1.5}, r"command_zero_prob=1.5 is invalid; valid range: 0..1"),
        ({"swing_height": 0.0}, r"swing_height=0.0 is invalid; it must be finite and > 0"),
        ({"gait_freq_hz": 0.0}, r"rew_feet_swing_height needs the gait clock"),
        (
            {"gait_freq_hz": 0.0, "rew_feet_swing_height": 0.0, "rew_feet_contact_clock": 1.0},
            r"rew_feet_contact_clock needs the gait clock",
        ),
        ({"rew_pose": float("nan")}, r"rew_pose=nan is invalid; a reward weight must be finite"),
        (
            {"rew_gait_reference": 1.0},
            r"rew_gait_reference=1.0 needs a reference gait, which go2_joystick_flat does not have",
        ),
        (
            {"residual_reference": True},
            r"residual_reference=true needs a reference gait, which go2_joystick_flat does not",
        ),
        (
            {"gait_freq_hz": 0.0, "rew_feet_swing_height": 0.0, "residual_reference": True},
            r"residual_reference=true needs the gait clock",
        ),
        ({"episode_steps": 0}, r"episode_steps=0 is invalid"),
        ({"num_threads": 0}, r"num_threads=0 is invalid"),
    ],
)
def test_bad_options_raise_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        _vec(GO2, n=1, **kwargs)
    assert "\n" not in str(e.value)


def test_unknown_options_and_bad_actions_are_refused():
    with pytest.raises(TypeError, match="unknown option.*rew_tracking_lin_vell.*valid options"):
        Go2JoystickFlatVecEnv(num_envs=1, rew_tracking_lin_vell=1.0)
    with pytest.raises(TypeError, match="unknown option.*reward_version"):
        gym.make(DUCK, reward_version="v1")
    env = Go2JoystickFlatVecEnv(num_envs=2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((2, 12)))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(2, 12\), got \(2, 14\)"):
        env.step(np.zeros((2, 14)))
    bad = np.zeros((2, 12))
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or Inf in env\(s\) \[1\]"):
        env.step(bad)
    env.step(np.full((2, 12), 3.0))
    assert env.action_clip_count == 24
    np.testing.assert_array_equal(env.action, 1.0)
    env.close()


# ---------------------------------------------------------------------------------------------
# Commands, terminations, autoreset
# ---------------------------------------------------------------------------------------------


def test_commands_are_in_range_resampled_on_time_and_observed():
    env = Go2JoystickFlatVecEnv(
        num_envs=4,
        command_resample_s=[0.1, 0.1],
        command_zero_prob=0.0,
        lin_vel_x=[0.2, 0.6],
        info_mode="full",
    )
    obs, _ = env.reset(seed=7)
    cmd = obs[:, 42:45].copy()
    seen = [cmd]
    for _ in range(1, 16):
        obs, _, _, _, info = env.step(np.zeros((4, 12)))
        np.testing.assert_allclose(info["command"], seen[-1], atol=1e-6)  # tracked = last observed
        seen.append(obs[:, 42:45].copy())
    seen = np.array(seen)  # (16, 4, 3)
    changed = np.any(seen[1:] != seen[:-1], axis=2)  # (15, 4)
    # 0.1 s = 5 control steps: a new command after steps 5, 10 and 15 of every env
    assert changed.T.tolist() == [[(t + 1) % 5 == 0 for t in range(15)]] * 4
    assert (seen[..., 0] >= 0.2).all() and (seen[..., 0] <= 0.6).all()
    assert (np.abs(seen[..., 1]) <= 0.5).all() and (np.abs(seen[..., 2]) <= 1.0).all()
    env.close()
    still = Go2JoystickFlatVecEnv(num_envs=3, command_zero_prob=1.0)
    obs, _ = still.reset(seed=0)
    assert (obs[:, 42:45] == 0).all()
    still.close()


def test_command_share_of_zeros():
    env = Go2JoystickFlatVecEnv(num_envs=200, command_zero_prob=0.25)
    env.reset(seed=0)
    share = np.mean(np.all(env.command == 0, axis=1))
    assert 0.15 < share < 0.35
    env.close()


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_fall_terminates_time_out_truncates_and_autoreset(mode):
    env = Go2JoystickFlatVecEnv(num_envs=3, episode_steps=5, autoreset_mode=mode, info_mode="full")
    env.reset(seed=0)
    d, m = env.sim.datas[0], env.sim.models[0]
    d.qpos[3:7] = (
        np.cos(np.pi / 3),
        np.sin(np.pi / 3),
        0.0,
        0.0,
    )  # rolled 120 degrees: up z = -0.5
    mujoco.mj_forward(m, d)
    obs, r, te, tr, info = env.step(np.zeros((3, 12)))
    assert te.tolist() == [True, False, False] and not tr.any()
    assert (
        info["log"][termination_tag("fallen")] == 1
        and info["log"][termination_tag("time_out")] == 0
    )
    if mode == "same_step":
        assert info["_final_obs"].tolist() == [True, False, False]
        assert env.step_count[0] == 0  # already reset
    else:
        obs, r, te, tr, info = env.step(np.zeros((3, 12)))  # env 0 resets, ignores its action
        assert r[0] == 0.0 and not te[0] and not tr[0] and info["step"][0] == 0
        assert info["upright_cos"][0] > 0.99
    while not tr[1]:
        obs, r, te, tr, info = env.step(np.zeros((3, 12)))
    assert tr[1] and tr[2] and not te[1] and info["step"][1] == 5
    log = env.pop_log()
    assert log[termination_tag("fallen")] == 1 and log[termination_tag("time_out")] >= 2
    env.close()


# ---------------------------------------------------------------------------------------------
# Reward terms on hand-made states
# ---------------------------------------------------------------------------------------------


def _state(**kw):
    """A hand-made state of 2 envs and 4 feet: env 0 is ideal, env 1 is off in every way."""
    opts = SimpleNamespace(
        tracking_sigma_lin=0.25,
        tracking_sigma_ang=0.25,
        base_height_target=0.3,
        air_time_min_s=0.1,
        air_time_max_s=0.5,
        swing_height=0.08,
    )
    s = SimpleNamespace(
        opts=opts,
        command=np.array([[0.5, -0.2, 0.3], [0.5, -0.2, 0.3]]),
        moving=np.array([True, True]),
        lin_vel=np.array([[0.5, -0.2, 0.0], [0.1, 0.3, 0.4]]),
        gyro=np.array([[0.0, 0.0, 0.3], [0.5, -0.7, -0.4]]),
        gravity=np.array([[0.0, 0.0, -1.0], [0.3, 0.1, -0.95]]),
        upright_cos=np.array([1.0, 0.95]),
        trunk_height=np.array([0.3, 0.22]),
        default=np.zeros(12),
        joint_pos=np.array([np.zeros(12), np.full(12, 0.3)]),
        action=np.array([np.full(12, 0.5), np.full(12, 0.5)]),
        prev_action=np.array([np.full(12, 0.5), np.full(12, -0.5)]),
        foot_phase=np.array([[0.25, 0.75, 0.75, 0.25]] * 2),
        foot_height=np.array([[0.08, 0.0, 0.0, 0.08], [0.0, 0.05, 0.03, 0.0]]),
        foot_vel=np.zeros((2, 4, 3)),
        contact=np.array([[False, True, True, False], [True, True, True, True]]),
        touchdown=np.zeros((2, 4), dtype=bool),
        air_time_at_touchdown=np.zeros((2, 4)),
        fallen=np.array([False, True]),
    )
    s.foot_vel[1, :, 0] = 0.4  # env 1: feet sliding at 0.4 m/s
    for k, v in kw.items():
        setattr(s, k, v)
    return s


KERNELS = ("tracking_lin_vel", "tracking_ang_vel", "upright", "pose", "feet_swing_height")
PENALTIES = (
    "lin_vel_z",
    "ang_vel_xy",
    "orientation",
    "base_height",
    "action_rate",
    "similar_to_default",
    "foot_clearance",
    "foot_slip",
    "termination",
)


def test_every_reward_term_is_a_kernel_a_penalty_or_air_time():
    others = {"feet_air_time", "feet_contact_clock", "gait_reference"}  # tested below
    assert set(KERNELS) | set(PENALTIES) | others == set(REWARD_TERMS)


@pytest.mark.parametrize("name", KERNELS)
def test_tracking_terms_are_maximal_at_zero_error(name):
    raw = REWARD_TERMS[name](_state())
    assert raw[0] == pytest.approx(1.0) and 0.0 <= raw[1] < raw[0]
    for cfg in (Go2JoystickFlatConfig, MicroduckJoystickConfig):
        assert getattr(cfg, REWARD_PREFIX + name) >= 0


@pytest.mark.parametrize("name", PENALTIES)
def test_penalties_are_zero_when_ideal_and_never_positive(name):
    s = _state()
    if name == "foot_clearance":  # env 0: feet at swing height or still; env 1: low and sliding
        s.foot_height[0] = 0.08
    raw = REWARD_TERMS[name](s)
    assert raw[0] == pytest.approx(0.0, abs=1e-12) and raw[1] > 0
    for cfg in (Go2JoystickFlatConfig, MicroduckJoystickConfig):
        w = getattr(cfg, REWARD_PREFIX + name)
        assert w <= 0 and np.all(w * raw <= 0)


def test_feet_air_time_pays_long_swings_only_when_moving():
    s = _state(
        touchdown=np.array([[True, False, False, False], [True, False, False, False]]),
        air_time_at_touchdown=np.array([[0.35, 0, 0, 0], [0.04, 0, 0, 0]]),
    )
    raw = REWARD_TERMS["feet_air_time"](s)
    assert raw[0] == pytest.approx(0.25) and raw[1] == pytest.approx(-0.06)  # shuffling costs
    s.air_time_at_touchdown[0, 0] = 2.0
    assert REWARD_TERMS["feet_air_time"](s)[0] == pytest.approx(0.4)  # capped at max - min
    s.moving = np.array([False, False])
    np.testing.assert_array_equal(REWARD_TERMS["feet_air_time"](s), 0.0)
    assert (
        Go2JoystickFlatConfig.rew_feet_air_time >= 0
        and MicroduckJoystickConfig.rew_feet_air_time > 0
    )


def test_swing_height_wants_feet_down_when_the_command_is_zero():
    s = _state(moving=np.array([False, False]), foot_height=np.zeros((2, 4)))
    assert REWARD_TERMS["feet_swing_height"](s)[0] == pytest.approx(1.0)
    s.foot_height[1, 0] = 0.08
    assert REWARD_TERMS["feet_swing_height"](s)[1] == pytest.approx(np.exp(-1.0))


def test_contact_clock_pays_stepping_to_the_clock_and_nothing_for_standing_through_a_command():
    s = _state()  # env 0: swing feet (phase < 0.5) up, stance feet down; env 1: all feet down
    raw = REWARD_TERMS["feet_contact_clock"](s)
    assert raw[0] == pytest.approx(1.0) and raw[1] == pytest.approx(0.0)
    s.contact = ~s.contact  # every foot against its phase
    assert REWARD_TERMS["feet_contact_clock"](s)[0] == pytest.approx(-1.0)
    s = _state(moving=np.array([False, False]))  # a zero command: all feet down is ideal
    assert REWARD_TERMS["feet_contact_clock"](s).tolist() == pytest.approx([0.0, 1.0])
    assert Go2JoystickFlatConfig.rew_feet_contact_clock == 0  # an option, off by default
    assert MicroduckJoystickConfig.rew_feet_contact_clock == 0


# ---------------------------------------------------------------------------------------------
# Logs, threads, seeds
# ---------------------------------------------------------------------------------------------


def test_logs_carry_exactly_the_configured_terms():
    weights = {
        "rew_feet_swing_height": 0.0,
        "rew_foot_slip": 0.0,
        "rew_termination": -2.0,
        "rew_upright": 0.7,
    }
    env = Go2JoystickFlatVecEnv(num_envs=3, info_mode="full", positive_reward=False, **weights)
    defaults = {
        f.name: f.default for f in fields(Go2JoystickFlatConfig) if f.name.startswith("rew_")
    }
    expected = [n for n in REWARD_TERMS if {**defaults, **weights}[REWARD_PREFIX + n] != 0]
    assert "foot_slip" not in expected and "termination" in expected and "upright" in expected
    assert list(env.rewards.names) == expected
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    sums = {n: 0.0 for n in expected}
    for _ in range(4):
        _, r, _, _, info = env.step(rng.uniform(-1, 1, (3, 12)))
        assert set(info["reward_terms"]) == set(expected)
        total = sum(info["reward_terms"][n] for n in expected)
        np.testing.assert_allclose(r, CONTROL_DT * total, rtol=1e-12, atol=1e-15)
        assert set(info["log"]) == {reward_tag(n) for n in expected} | {
            termination_tag("fallen"),
            termination_tag("time_out"),
        }
        for n in expected:
            assert info["log"][reward_tag(n)] == pytest.approx(info["reward_terms"][n].mean())
            sums[n] += info["reward_terms"][n].mean()
    log = env.pop_log()
    assert set(log) == {reward_tag(n) for n in expected} | {
        termination_tag("fallen"),
        termination_tag("time_out"),
    }
    assert not any(k.startswith("Episode_Reward") for k in log)
    for n in expected:
        assert log[reward_tag(n)] == pytest.approx(sums[n] / 4)
    assert set(env.pop_log()) == {termination_tag("fallen"), termination_tag("time_out")}
    env.close()


def test_positive_reward_clips_each_step_at_zero():
    kw = dict(
        num_envs=4, rew_tracking_lin_vel=0.0, rew_tracking_ang_vel=0.0, rew_feet_swing_height=0.0
    )
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (3, 4, 12))
    clipped, raw = Go2JoystickFlatVecEnv(**kw), Go2JoystickFlatVecEnv(positive_reward=False, **kw)
    clipped.reset(seed=2), raw.reset(seed=2)
    for a in actions:
        rc = clipped.step(a)[1]
        rr = raw.step(a)[1]
        assert (rr < 0).all() and (rc == 0).all()
    clipped.close(), raw.close()


def test_fall_penalty_is_paid_in_full_after_the_positive_clip():
    # The step a robot falls: the other terms clip at 0, the penalty does not vanish with them.
    rewards = {}
    for positive in (True, False):
        env = Go2JoystickFlatVecEnv(num_envs=2, rew_termination=-30.0, positive_reward=positive)
        env.reset(seed=0)
        d, m = env.sim.datas[0], env.sim.models[0]
        d.qpos[3:7] = (np.cos(np.pi / 3), np.sin(np.pi / 3), 0.0, 0.0)  # rolled 120 degrees
        mujoco.mj_forward(m, d)
        _, r, te, _, _ = env.step(np.zeros((2, 12)))
        assert te.tolist() == [True, False]
        fall = CONTROL_DT * env.rewards.weighted_term("termination")
        assert fall.tolist() == pytest.approx([-30.0 * CONTROL_DT, 0.0])
        rewards[positive] = (r, CONTROL_DT * env.rewards.total)
        env.close()
    (clipped, total), (raw, raw_total) = rewards[True], rewards[False]
    rest = total[0] - fall[0]
    assert clipped[0] == pytest.approx(max(rest, 0.0) + fall[0]) and clipped[0] < 0
    assert raw[0] == pytest.approx(raw_total[0])
    assert clipped[1] == pytest.approx(max(total[1], 0.0)) and clipped[1] >= 0
    # Without the term, the table has none and the clip is as before.
    env = Go2JoystickFlatVecEnv(num_envs=2)
    assert "termination" not in env.rewards.names
    assert env.rewards.weighted_term("termination").tolist() == [0.0, 0.0]
    env.close()
    # Go2's PPO trains and evaluates with the penalty by default (the task table); the others not.
    from raylab.algorithms.build import env_options

    for algo, weight in (("ppo", -200.0), ("appo", 0.0), ("sac", 0.0)):
        cfg = compose(algo, "go2_joystick_flat")
        for evaluation in (False, True):
            assert env_options(cfg, evaluation=evaluation)["rew_termination"] == weight


def test_rllib_style_dict_info_to_list_and_pop_log():
    env = DictInfoToList(_vec(GO2, n=3, num_threads=2, episode_steps=20))
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    env.reset(seed=0)
    for _ in range(25):
        _, _, _, _, infos = env.step(np.zeros((3, 12)))
        assert infos == [{}, {}, {}]
    log = env.unwrapped.pop_log()
    assert log[termination_tag("time_out")] == 3 and reward_tag("tracking_lin_vel") in log
    env.close()


@pytest.mark.parametrize("gym_id, mode", [(GO2, "next_step"), (DUCK, "same_step")])
def test_thread_count_never_changes_a_bit(gym_id, mode):
    n, steps = 5, 120
    act_dim = 12 if gym_id == GO2 else 14
    actions = np.random.default_rng(3).uniform(-1, 1, (steps, n, act_dim))
    kw = dict(
        episode_steps=50,
        domain_randomization=True,
        push_vel=0.5,
        push_interval_s=[0.2, 0.4],
        command_resample_s=[0.2, 0.6],
        autoreset_mode=mode,
        allow_overcommit=True,
    )
    runs = []
    for t in (1, 2, 4):
        env = VEC[gym_id](num_envs=n, num_threads=t, **kw)
        runs.append(_rollout(env, actions, seed=21))
        env.close()
    base = runs[0]
    assert base["trunc"].sum() + base["term"].sum() >= n  # autoresets happened
    for other in runs[1:]:
        for k in ("obs", "rew", "term", "trunc", "final"):
            assert np.array_equal(base[k], other[k]), k
        assert base["log"] == other["log"]


def test_seeded_runs_are_identical_and_seeds_matter():
    actions = np.random.default_rng(4).uniform(-1, 1, (60, 3, 12))
    kw = dict(num_envs=3, domain_randomization=True, push_vel=0.5, push_interval_s=[0.2, 0.4])
    a = _rollout(Go2JoystickFlatVecEnv(**kw), actions, seed=5)
    b = _rollout(Go2JoystickFlatVecEnv(**kw), actions, seed=5)
    c = _rollout(Go2JoystickFlatVecEnv(**kw), actions, seed=6)
    for k in ("obs", "rew", "term", "trunc"):
        assert np.array_equal(a[k], b[k]), k
    assert not np.array_equal(a["obs"], c["obs"])
    # env i under seed s is env 0 under seed s + i (the single env is the same code)
    single = Go2JoystickFlatEnv(domain_randomization=True, push_vel=0.5, push_interval_s=[0.2, 0.4])
    obs, _ = single.reset(seed=6)
    np.testing.assert_array_equal(obs, a["obs"][0, 1])
    for t in range(20):
        obs, r, *_ = single.step(actions[t, 1])
        np.testing.assert_array_equal(obs, a["obs"][t + 1, 1])
        assert r == a["rew"][t, 1]


def test_domain_randomisation_writes_private_models_and_restores_them():
    env = Go2JoystickFlatVecEnv(num_envs=2, domain_randomization=True)
    env.reset(seed=0)
    m0, m1, nominal = env.sim.models[0], env.sim.models[1], env.nominal
    assert m0.geom_friction[0, 0] != m1.geom_friction[0, 0]
    assert m0.actuator_gainprm[0, 0] != nominal["actuator_gainprm"][0, 0]
    assert m0.actuator_biasprm[0, 1] == -m0.actuator_gainprm[0, 0]
    env.opts.domain_randomization = False
    env.reset(seed=0)
    for name, value in nominal.items():
        np.testing.assert_array_equal(getattr(m0, name), value)
    env.close()


def test_pushes_kick_the_trunk_on_schedule():
    env = Go2JoystickFlatVecEnv(
        num_envs=2, push_vel=1.0, push_interval_s=[0.1, 0.1], info_mode="full"
    )
    env.reset(seed=0)
    pushed = []
    for _ in range(12):
        *_, info = env.step(np.zeros((2, 12)))
        pushed.append(info["pushed"].copy())
    assert np.array(pushed)[:, 0].tolist() == [(t + 1) % 5 == 0 for t in range(12)]
    off = Go2JoystickFlatVecEnv(num_envs=2, info_mode="full")
    off.reset(seed=0)
    assert not any(off.step(np.zeros((2, 12)))[4]["pushed"].any() for _ in range(30))
    env.close(), off.close()


def _go2_kicks(**opts):
    """(pushed, kick) of 10 steps of two Go2s pushed every step they can be (0.1-s intervals),
    and the env steps counted."""
    env = Go2JoystickFlatVecEnv(num_envs=2, push_interval_s=[0.1, 0.1], info_mode="full", **opts)
    env.reset(seed=0)
    out = []
    for _ in range(10):
        *_, info = env.step(np.zeros((2, 12)))
        out.append((info["pushed"].copy(), env.kick.copy()))
    steps = env.env_steps
    env.close()
    return out, steps


def test_a_push_curriculum_scales_the_kicks_and_draws_the_same_schedule():
    """Training only: the kicks are the task's draws times the curriculum's factor (0: nobody
    is pushed), on the same steps; the factor follows the env steps of all envs."""

    def kicks(**opts):
        return _go2_kicks(push_vel=1.0, **opts)

    task, steps = kicks()
    assert steps == 20
    off, _ = kicks(push_curriculum_steps=1000, push_scale_start=0.0, push_scale_end=0.0)
    assert not any(p.any() for p, _ in off)
    half, _ = kicks(push_scale_end=0.5)
    ramp, _ = kicks(push_curriculum_steps=16, push_scale_start=0.0)  # factor = env steps / 16
    for t, ((p, k), (p_half, k_half), (p_ramp, k_ramp)) in enumerate(zip(task, half, ramp)):
        assert np.array_equal(p, p_half) and np.array_equal(p_ramp, p)
        np.testing.assert_allclose(k_half[p], 0.5 * k[p])
        if p.any():  # interval_push runs before the step's env steps are counted
            np.testing.assert_allclose(k_ramp[p], min(1.0, 2 * t / 16) * k[p])
    with pytest.raises(ValueError, match=r"push_scale_end=4.0 is invalid; valid range: 0..3.0"):
        Go2JoystickFlatVecEnv(num_envs=1, push_scale_end=4.0)
    from raylab.envs.tasks import TASKS

    for task in ("go2_joystick_flat", "microduck_joystick"):  # evaluation runs the defaults
        only = TASKS[task].training_only_options()
        assert only == {
            "push_curriculum_steps": 0,
            "push_scale_start": 0.0,
            "push_scale_end": 1.0,
            "train_push_vel": None,
            "train_command_resample_s": None,
        }


def test_train_push_vel_pushes_in_training_and_evaluation_runs_the_task_without():
    """env.train_push_vel pushes a task without pushes (Go2) in training: the same kicks as the
    task's own push_vel of that speed would give, on the same steps; evaluation's env options
    unset it, so the evaluated Go2 is never pushed. A bad value is one line."""
    from raylab.algorithms.build import env_options
    from raylab.config import compose

    def kicks(**opts):
        return _go2_kicks(**opts)[0]

    own, trained = kicks(push_vel=0.7), kicks(train_push_vel=0.7)
    assert any(p.any() for p, _ in trained)
    for (p, k), (p_t, k_t) in zip(own, trained):
        assert np.array_equal(p, p_t) and np.array_equal(k[p], k_t[p])
    assert not any(p.any() for p, _ in kicks(push_vel=0.7, train_push_vel=0.0))
    cfg = compose(
        "ppo",
        "go2_joystick_flat",
        overrides=["env.train_push_vel=0.5", "env.push_interval_s=[0.1,0.1]"],
    )
    assert env_options(cfg)["train_push_vel"] == 0.5
    assert env_options(cfg, evaluation=True)["train_push_vel"] is None
    for evaluation, pushes in ((False, True), (True, False)):
        opts = {**env_options(cfg, evaluation=evaluation), "num_envs": 2, "info_mode": "full"}
        env = Go2JoystickFlatVecEnv(**opts)
        env.reset(seed=0)
        assert any(env.step(np.zeros((2, 12)))[4]["pushed"].any() for _ in range(10)) == pushes
        env.close()
    with pytest.raises(ValueError, match=r"train_push_vel=-1.0 is invalid; it must be null or"):
        Go2JoystickFlatVecEnv(num_envs=1, train_push_vel=-1.0)


def test_train_command_resample_s_changes_commands_in_training_only():
    """env.train_command_resample_s resamples the command on its own schedule in training; the
    evaluation's env options unset it, so the evaluated task keeps command_resample_s. A bad
    range is one line."""
    from raylab.algorithms.build import env_options
    from raylab.config import compose

    cfg = compose(
        "ppo",
        "go2_joystick_flat",
        overrides=["env.train_command_resample_s=[0.1,0.1]", "env.command_zero_prob=0"],
    )
    assert env_options(cfg)["train_command_resample_s"] == [0.1, 0.1]
    assert env_options(cfg, evaluation=True)["train_command_resample_s"] is None
    for evaluation, changes in ((False, 4), (True, 0)):  # 0.1 s = 5 steps; the task's 4-8 s
        opts = {**env_options(cfg, evaluation=evaluation), "num_envs": 2}
        env = Go2JoystickFlatVecEnv(**opts)
        env.reset(seed=0)
        seen = [env.command.copy()]
        for _ in range(20):
            env.step(np.zeros((2, 12)))
            seen.append(env.command.copy())
        n = [sum(not np.array_equal(a[i], b[i]) for a, b in zip(seen, seen[1:])) for i in (0, 1)]
        assert n == [changes, changes]
        env.close()
    for bad in ([3.0, 1.0], [0.0, 1.0]):
        with pytest.raises(ValueError, match=r"train_command_resample_s=\[.*\] is invalid"):
            Go2JoystickFlatVecEnv(num_envs=1, train_command_resample_s=bad)


def _hold_pose_errors(gym_id="raylab/Go2JoystickFlat-v0", options=None, episodes=3, seed=0):
    env = eval_vec_env(gym_id, options or {}, episodes, batched=True)
    try:
        return run_policy_episodes(hold_pose_policy(env.single_action_space), env, episodes, seed)
    finally:
        env.close()


def test_tracking_error_of_standing_still_is_the_command_speed():
    opts = {"episode_steps": 60, "lin_vel_x": [0.5, 1.0], "command_zero_prob": 0.0}
    s = _hold_pose_errors(options=opts, episodes=3, seed=0)
    assert s["survival"] == 1.0 and s["mean_episode_length"] == 60
    assert s["lin_vel_error"] == pytest.approx(s["command_speed"], abs=0.05)
    assert s["lin_vel_error_moving"] == s["lin_vel_error"] and s["lin_vel_error_still"] is None
    still = _hold_pose_errors(
        options={"episode_steps": 30, "command_zero_prob": 1.0, "init_noise": 0.0},
        episodes=2,
        seed=0,
    )
    assert still["lin_vel_error"] < 0.005 and still["yaw_rate_error"] < 0.005
    assert still["lin_vel_error_moving"] is None and still["command_speed"] is None


def test_track_error_tool_prints_and_writes_the_hold_pose_errors(tmp_path, capsys):
    from raylab.evaluate import main

    out = tmp_path / "te.json"
    assert (
        main(["track-error", "--task", "microduck_joystick", "--episodes", "3", "--out", str(out)])
        == 0
    )
    line = capsys.readouterr().out
    got = json.loads(out.read_text())["hold_default_pose"]
    want = _hold_pose_errors("raylab/MicroduckJoystick-v0", episodes=3, seed=1000)
    for key in ("lin_vel_error_moving", "yaw_rate_error_moving", "survival", "mean_return"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert (
        line.startswith("hold default pose")
        and f"(moving {got['lin_vel_error_moving']:.3f}" in line
    )


def test_track_error_tool_refuses_unknown_commands_and_bad_episodes(capsys):
    from raylab.evaluate import main

    assert main(["track-err"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "raylab: error: unknown command 'track-err'; valid choices: track-error"
    assert main(["track-error", "--episodes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "raylab: error: --episodes 0: must be at least 1"


def test_the_go2_ppo_sweep_file_is_valid():
    from pathlib import Path

    from raylab.sweep import load_spec

    spec = load_spec(
        str(Path(__file__).resolve().parents[1] / "tune_configs" / "ppo_go2_joystick_flat.yaml")
    )
    assert spec.task == "go2_joystick_flat" and spec.algo == "ppo"
    assert {"algo.lr", "algo.train_batch_size"} <= set(spec.search)


def test_microduck_joystick_stands_20_s_with_zero_action_without_pushes_and_falls_with_them():
    """The joystick task uses the balance task's kp 0.55 duck: it stands on its own, and the
    default pushes knock the zero-action duck over (docs/envs.md, joystick measured numbers)."""
    duck = "raylab/MicroduckJoystick-v0"
    still = _hold_pose_errors(duck, options={"push_vel": 0.0}, episodes=8, seed=1000)
    assert still["survival"] == 1.0 and still["mean_episode_length"] == 1000
    pushed = _hold_pose_errors(duck, episodes=8, seed=1000)
    assert pushed["survival"] < 0.5


# ---------------------------------------------------------------------------------------------
# The microduck's reference gait
# ---------------------------------------------------------------------------------------------


def _ankles(q: np.ndarray) -> np.ndarray:
    """(F, 3) ankle axes relative to each leg's hip pitch axis, in the trunk frame (level trunk),
    for the servo angles ``q``: MuJoCo's forward kinematics of the real model."""
    from raylab.envs.robots.microduck import ACTUATOR_NAMES

    m = prototype()
    d = mujoco.MjData(m)
    d.qpos[:] = m.key_qpos[m.key("stand").id]
    for k, name in enumerate(ACTUATOR_NAMES):
        d.qpos[m.jnt_qposadr[m.joint(name).id]] = q[k]
    mujoco.mj_kinematics(m, d)
    return np.array(
        [
            d.xpos[m.body(f"{s}_foot").id] - d.xpos[m.body(f"{s}_thigh").id]
            for s in ("left", "right")
        ]
    )


def test_the_reference_gait_walks_the_feet_along_the_command():
    from raylab.envs.tasks.microduck_joystick import STAND_REACH

    env = MicroduckJoystickVecEnv(
        num_envs=4, gait_freq_hz=2.5, rew_gait_reference=2.0, reference_lean=0.005
    )
    env.reset(seed=0)
    # forward within reach, sideways, turning, and a zero command
    env.command[:] = [[0.2, 0, 0], [0, 0.2, 0], [0, 0, 1.0], [0, 0, 0]]
    env.moving[:] = [True, True, True, False]
    path, refs = [], []
    for phase in np.arange(0.0, 1.0, 0.05):
        env.foot_phase = np.tile([phase, (phase + 0.5) % 1.0], (4, 1))
        q = gait_reference(env)
        np.testing.assert_array_equal(q[3], env.default)  # a zero command: the default pose
        assert np.all(q >= env.robot.lower) and np.all(q <= env.robot.upper)
        path.append([_ankles(q[i]) for i in range(3)])
        refs.append(q)
    path, refs = np.array(path), np.array(refs)  # (phase, command, foot, xyz), (phase, env, J)
    fwd = path[:, 0, 0]  # the left ankle under the forward command, from its hip pitch axis
    stance = slice(10, 20)  # phase >= 0.5
    # stance: the leg a strut of the stand's length (knee at the stand's bend), sweeping back at
    # the command's speed: 0.2 m/s x 0.2 s = 4 cm, from 2 cm ahead of the lean to 2 cm behind
    np.testing.assert_allclose(refs[stance, 0, 3], env.default[3], atol=1e-9)
    np.testing.assert_allclose(np.hypot(fwd[stance, 0], fwd[stance, 2]), STAND_REACH, atol=1e-6)
    np.testing.assert_allclose(np.diff(fwd[stance, 0]), -0.04 / 10, atol=1e-6)
    assert fwd[10, 0] == pytest.approx(0.02 - 0.005, abs=1e-6)
    # swing: forward, the ankle lifted by reference_lift at mid-swing; the foot stays level
    assert np.all(np.diff(fwd[:11, 0]) > 0)
    assert fwd[5, 2] + np.sqrt(STAND_REACH**2 - fwd[5, 0] ** 2) == pytest.approx(0.008, abs=1e-6)
    np.testing.assert_allclose(refs[:, 0, 2] + refs[:, 0, 3] + refs[:, 0, 4], 0.0, atol=1e-9)
    # the other foot is half a cycle behind
    np.testing.assert_allclose(path[:10, 0, 1], path[10:, 0, 0], atol=1e-9)
    # sideways: the stance foot moves right (-y) under a leftward command; turning: the stance
    # hip yaw turns clockwise under a counter-clockwise command
    assert np.all(np.diff(path[stance, 1, 0, 1]) < 0)
    assert refs[12, 2, 0] > 0 > refs[18, 2, 0]


def test_the_gait_reference_term_is_one_on_the_reference_and_needs_the_clock():
    env = MicroduckJoystickVecEnv(num_envs=2, gait_freq_hz=2.5, rew_gait_reference=2.0)
    env.reset(seed=0)
    env.command[:] = [[0.3, 0, 0.5], [0.3, 0, 0.5]]
    env.moving[:] = True
    ref = gait_reference(env)
    env.joint_pos = np.array([ref[0], env.default])
    raw = REWARD_TERMS["gait_reference"](env)
    assert raw[0] == pytest.approx(1.0) and 0 < raw[1] < 1
    _, r, *_ = env.step(np.zeros((2, 14)))
    assert "gait_reference" in env.rewards.names and np.all(np.isfinite(r))
    env.close()
    with pytest.raises(ValueError, match="rew_gait_reference needs the gait clock"):
        MicroduckJoystickVecEnv(num_envs=1, rew_gait_reference=1.0)
    with pytest.raises(ValueError, match=r"reference_lift=0.1 is invalid; valid range: 0.0..0.02"):
        MicroduckJoystickVecEnv(num_envs=1, reference_lift=0.1)
    assert MicroduckJoystickConfig.rew_gait_reference == 0  # an option, off by default


def test_residual_actions_are_offsets_from_the_reference_gait_at_the_observed_clock():
    """residual_reference: servo target = the reference at the phase and command the last
    observation showed + action_scale * action; off (the default), the default pose + the same."""
    kw = dict(num_envs=3, gait_freq_hz=2.5, push_vel=0.0, command_zero_prob=0.0)
    kw.update(lin_vel_x=[0.3, 0.3], lin_vel_y=[0, 0], ang_vel_yaw=[0.5, 0.5])
    res, plain = (
        MicroduckJoystickVecEnv(**kw, residual_reference=True),
        MicroduckJoystickVecEnv(**kw),
    )
    for env in (res, plain):
        env.reset(seed=0)
    act = np.random.default_rng(0).uniform(-1, 1, (3, 14))
    targets = []
    for t in range(30):
        a = act * (t % 3 - 1)  # zero, negative and positive offsets
        phase = res.foot_phase.copy()
        ref = gait_reference(res)
        assert res.moving.all() and not np.allclose(ref, res.default)
        res.step(a)
        plain.step(a)
        scale = res.opts.action_scale
        ctrl = res.ctrl[:, res.robot.act_ids]
        np.testing.assert_allclose(ctrl, np.clip(ref + scale * a, res.robot.lower, res.robot.upper))
        np.testing.assert_allclose(
            plain.ctrl[:, plain.robot.act_ids],
            np.clip(plain.default + scale * a, plain.robot.lower, plain.robot.upper),
        )
        assert not np.allclose(res.foot_phase, phase)  # the clock moved on: a new reference
        targets.append(ctrl.copy())
    assert np.ptp(np.array(targets)[0::3], axis=0).max() > 0.1  # zero actions walk the reference
    for env in (res, plain):
        env.close()
    assert MicroduckJoystickConfig.residual_reference is False  # an option, off by default


def test_the_baselines_of_a_residual_run_hold_the_stand_pose(tmp_path):
    """With residual actions a zero action walks the reference open loop; the do-nothing
    baselines (and the headroom / tracking targets judged against them) still hold the pose."""
    from raylab.evaluate import baseline_scores, make_eval_env

    short = ["env.episode_steps=100", "env.gait_freq_hz=2.5", "env.num_envs=2"]
    plain = compose("ppo", "microduck_joystick", "mujoco", short)
    res = compose("ppo", "microduck_joystick", "mujoco", [*short, "env.residual_reference=true"])
    b_plain = baseline_scores(plain, episodes=4, seed=1000, cache_dir=tmp_path / "a")
    b_res = baseline_scores(res, episodes=4, seed=1000, cache_dir=tmp_path / "b")
    assert b_res == b_plain and b_plain["hold_pose"]["survival"] == 1.0
    env = make_eval_env(res, 4)  # the residual env itself: zero actions fall within 2 s
    try:
        walk = run_policy_episodes(hold_pose_policy(env.single_action_space), env, 4, 1000)
    finally:
        env.close()
    assert walk["survival"] < 0.9 and walk["mean_return"] != b_plain["hold_pose"]["mean_return"]
