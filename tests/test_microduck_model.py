"""The Microduck MJCF and its physics variants (real MuJoCo, no mocks)."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from raylab.envs import asset_path
from raylab.envs.microduck import (
    ACTUATOR_NAMES,
    STAND_HEIGHT,
    VARIANTS,
    load_model,
    prototype,
    robot_index,
)
from raylab.envs.microduck_vec import MicroduckBalanceVecEnv


def test_asset_is_our_own_primitive_mjcf():
    text = asset_path("microduck.xml").read_text()
    assert "<mesh" not in text and "file=" not in text  # no upstream meshes or includes
    m = prototype("default")
    assert m.nmesh == 0
    primitives = {mujoco.mjtGeom.mjGEOM_BOX, mujoco.mjtGeom.mjGEOM_CAPSULE, mujoco.mjtGeom.mjGEOM_SPHERE}
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
    sole = min(d.geom_xpos[m.geom(f).id, 2] - m.geom_size[m.geom(f).id, 2]
               for f in ("left_foot", "right_foot"))  # fmt: skip
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


@pytest.mark.parametrize("variant", VARIANTS)
def test_holding_the_stand_pose_without_pushes_stands_a_full_episode(variant):
    env = MicroduckBalanceVecEnv(num_envs=4, num_threads=1, variant=variant, num_pushes=0,
                                 info_mode="full")  # fmt: skip
    env.reset(seed=7)
    heights, upright = [], []
    for _ in range(250):
        _, _, _, trunc, info = env.step(np.zeros((4, 14)))
        heights.append(info["trunk_height"])
        upright.append(info["upright_cos"])
    env.close()
    assert trunc.all()
    assert np.min(heights) > 0.10
    assert np.min(upright) > 0.95


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
