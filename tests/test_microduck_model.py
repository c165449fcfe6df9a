"""The Microduck MJCF and its physics variants (real MuJoCo, no mocks)."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from raylab.bench.baselines import run_baselines
from raylab.envs import asset_path
from raylab.envs.reference.microduck_balance import MicroduckBalanceEnv
from raylab.envs.robots.microduck import (
    ACTUATOR_NAMES,
    SERVO_FITS,
    STAND_HEIGHT,
    SURVIVAL_MIN_HEIGHT,
    SURVIVAL_MIN_UPRIGHT,
    VARIANTS,
    is_fallen,
    load_model,
    prototype,
    robot_index,
)
from raylab.envs.tasks.microduck_balance import MicroduckBalanceVecEnv

# The servo values of the robot facts (XL330 class), which the model must stand on.
FACT_SERVO = {
    "kp": 0.55,
    "force_limit": 0.96,
    "damping": 0.053,
    "frictionloss": 0.0048,
    "armature": 0.0018,
}
# The default task's hold-pose v2 return on seeds 0-4 (100 episodes each) is 303.0 +/- 11.8 over
# the seed means (docs/envs.md, Baselines); the band asserted below is that measurement +/- 3 sd
# of a 64-episode mean, not the upstream robot's 130-240 (docs/envs.md says why).
HOLD_POSE_V2_BAND = (265.0, 345.0)


def test_asset_is_our_own_primitive_mjcf():
    text = asset_path("microduck.xml").read_text()
    assert "<mesh" not in text and "file=" not in text  # no upstream meshes or includes
    m = prototype("default")
    assert m.nmesh == 0
    primitives = {
        mujoco.mjtGeom.mjGEOM_BOX,
        mujoco.mjtGeom.mjGEOM_CAPSULE,
        mujoco.mjtGeom.mjGEOM_SPHERE,
    }
    floor = m.geom("floor").id
    assert all(int(m.geom_type[g]) in primitives for g in range(m.ngeom) if g != floor)


def test_actuators_are_position_servos_in_task_order():
    m = prototype("default")
    assert m.nu == 14
    names = [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, i) for i in range(m.nu)]
    assert tuple(names) == ACTUATOR_NAMES
    for i, name in enumerate(ACTUATOR_NAMES):
        assert m.actuator_trnid[i, 0] == m.joint(name).id
        kp = m.actuator_gainprm[i, 0]
        assert kp > 0 and m.actuator_biasprm[i, 1] == -kp  # position servo
        assert m.actuator_forcelimited[i] and m.actuator_forcerange[i, 1] == pytest.approx(0.96)
    assert m.opt.timestep == 0.002


def test_trunk_sensors_and_stand_keyframe():
    m = prototype("default")
    d = mujoco.MjData(m)
    for name in ("gyro", "orientation"):
        assert m.sensor(name).id >= 0
    mujoco.mj_resetDataKeyframe(m, d, m.key("stand").id)
    mujoco.mj_forward(m, d)
    assert d.xpos[m.body("trunk").id, 2] == pytest.approx(STAND_HEIGHT, abs=1e-9)
    sole = min(
        d.geom_xpos[m.geom(f).id, 2] - m.geom_size[m.geom(f).id, 2]
        for f in ("left_foot", "right_foot")
    )
    assert abs(sole) < 1e-3  # the feet stand on the floor
    assert m.body_mass.sum() == pytest.approx(0.74, abs=0.01)


def test_whole_body_collides_with_the_floor_and_a_fallen_duck_rests_on_it():
    m = load_model("default")
    floor = m.geom("floor").id
    for g in range(m.ngeom):
        if g == floor:
            continue
        collides = (m.geom_contype[g] & m.geom_conaffinity[floor]) or (
            m.geom_contype[floor] & m.geom_conaffinity[g]
        )
        assert collides, mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g)
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, m.key("stand").id)
    d.qvel[0] = 1.5  # a hard shove: the duck falls over
    mujoco.mj_step(m, d, 1500)  # 3 s, at rest on the floor
    trunk_z = d.xpos[m.body("trunk").id, 2]
    assert trunk_z < 0.09  # it fell
    assert trunk_z > 0.02  # and did not sink through the floor
    feet = {m.geom("left_foot").id, m.geom("right_foot").id}
    touching = {int(c.geom1 if c.geom2 == floor else c.geom2) for c in d.contact[: d.ncon]}
    assert touching - feet, "a fallen duck rests on body geoms, not only on its feet"
    assert np.max(np.abs(d.qvel)) < 0.5


def test_servos_have_the_facts_values_and_the_masses_are_the_robots():
    m = prototype("default")
    for name in ACTUATOR_NAMES:
        a, j = m.actuator(name).id, m.joint(name).id
        dof = m.jnt_dofadr[j]
        assert m.actuator_gainprm[a, 0] == pytest.approx(FACT_SERVO["kp"])
        assert m.actuator_biasprm[a, 1] == pytest.approx(-FACT_SERVO["kp"])
        assert m.actuator_forcerange[a, 1] == pytest.approx(FACT_SERVO["force_limit"])
        assert m.dof_damping[dof] == pytest.approx(FACT_SERVO["damping"])
        assert m.dof_frictionloss[dof] == pytest.approx(FACT_SERVO["frictionloss"])
        assert m.dof_armature[dof] == pytest.approx(FACT_SERVO["armature"])
    assert m.body_subtreemass[m.body("trunk").id] == pytest.approx(0.74, abs=1e-9)
    assert m.body_mass[m.body("trunk").id] == pytest.approx(0.20)
    assert m.body_mass[m.body("head").id] == pytest.approx(0.19)


def test_domain_randomisation_fits_are_centred_on_the_nominal_servo():
    assert set(SERVO_FITS) == set(FACT_SERVO)
    for name, fits in SERVO_FITS.items():
        assert fits[0] == FACT_SERVO[name]  # the first fit is the model's nominal servo
        lo, hi = min(fits), max(fits)
        # frictionloss spans 6.7x, so its centre is the geometric one
        centre = np.sqrt(lo * hi) if name == "frictionloss" else (lo + hi) / 2
        assert centre == pytest.approx(FACT_SERVO[name], rel=0.06), name
    friction = SERVO_FITS["frictionloss"]
    assert 6.0 < max(friction) / min(friction) < 7.5  # the facts: about 6.7x


@pytest.mark.parametrize("variant", VARIANTS)
def test_holding_the_stand_pose_without_pushes_stands_a_full_episode(variant):
    """At the facts' servo values, with the default initial joint noise, on 16 seeded envs."""
    env = MicroduckBalanceVecEnv(
        num_envs=16, num_threads=1, variant=variant, num_pushes=0, info_mode="full"
    )
    env.reset(seed=7)
    heights, upright = [], []
    for _ in range(250):
        _, _, _, trunc, info = env.step(np.zeros((16, 14)))
        heights.append(info["trunk_height"])
        upright.append(info["upright_cos"])
        assert not info["fallen"].any()
    env.close()
    assert trunc.all()
    assert np.min(heights) > 0.10
    assert np.min(upright) > 0.95


def test_default_pushes_topple_the_hold_pose_duck_and_its_return_is_in_the_documented_band():
    env = MicroduckBalanceVecEnv(num_envs=64, num_threads=2, info_mode="full")
    env.reset(seed=123)
    ret, ever_fallen = np.zeros(64), np.zeros(64, dtype=bool)
    for _ in range(250):
        _, r, _, _, info = env.step(np.zeros((64, 14)))
        ret += r
        ever_fallen |= info["fallen"]
    env.close()
    assert ever_fallen.mean() >= 0.25
    assert HOLD_POSE_V2_BAND[0] <= ret.mean() <= HOLD_POSE_V2_BAND[1]


def test_random_actions_score_below_holding_the_pose_on_both_reward_versions():
    b = run_baselines(episodes=32, seeds=(3,), num_threads=2)
    for version in ("v1", "v2"):
        hold = b[f"{version}/hold_pose"]["return_mean_over_seeds"]
        assert b[f"{version}/random"]["return_mean_over_seeds"] < hold - 50
        assert b[f"{version}/random"]["survival"] < b[f"{version}/hold_pose"]["survival"]


def test_survival_counts_neither_a_duck_lying_down_nor_one_sitting():
    assert not is_fallen(STAND_HEIGHT, 1.0)
    assert not is_fallen(0.11, 0.9)  # leaning into a push
    assert is_fallen(0.05, 0.95)  # sat down: trunk level but low
    assert is_fallen(0.11, 0.3)  # tipping over
    assert is_fallen(0.04, 0.1)  # lying on the floor
    assert is_fallen(np.array([0.12, 0.05]), np.array([1.0, 1.0])).tolist() == [False, True]
    # A shoved duck at rest on the floor is fallen in both envs' info, although its trunk rests
    # above 4 cm.
    opts = dict(num_pushes=1, push_vel_min=1.2, push_vel_max=1.2, episode_steps=150)
    ref = MicroduckBalanceEnv(**opts)
    vec = MicroduckBalanceVecEnv(num_envs=1, num_threads=1, info_mode="full", **opts)
    _, info = ref.reset(seed=2)
    vec.reset(seed=2)
    assert not info["fallen"]
    for _ in range(150):
        *_, info = ref.step(np.zeros(14))
        *_, vinfo = vec.step(np.zeros((1, 14)))
    assert info["fallen"] and vinfo["fallen"][0]
    assert info["trunk_height"] < SURVIVAL_MIN_HEIGHT or info["upright_cos"] < SURVIVAL_MIN_UPRIGHT
    stats = vec.pop_episode_stats()
    assert stats["episodes"] == 1 and stats["survival"] < 1.0
    ref.close(), vec.close()


def test_variants_change_the_position_coordinates_so_joints_are_indexed_by_name():
    nq = {v: prototype(v).nq for v in VARIANTS}
    assert nq["default"] == 21
    assert len(set(nq.values())) == 3
    idx = {v: robot_index(v) for v in VARIANTS}
    assert not np.array_equal(idx["default"].qpos_adr, idx["backlash"].qpos_adr)
    assert not np.array_equal(idx["default"].qpos_adr, idx["toes"].qpos_adr)
    for v in VARIANTS:
        m, r = prototype(v), idx[v]
        for k, name in enumerate(ACTUATOR_NAMES):
            assert r.qpos_adr[k] == m.jnt_qposadr[m.joint(name).id]
        np.testing.assert_array_equal(r.stand, idx["default"].stand)
        assert m.key_qpos[r.key_id, 2] == STAND_HEIGHT


def test_load_model_returns_a_private_copy():
    a, b = load_model(), load_model()
    a.body_mass[1] *= 2.0
    assert b.body_mass[1] == prototype().body_mass[1] != a.body_mass[1]
