"""The Go2-like MJCF (envs/assets/go2.xml): facts, contacts, the home keyframe, standing still."""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest

from raylab.envs.tasks.go2 import ACTUATOR_NAMES, FOOT_RADIUS, HOME_POSE, LEGS, TASK, prototype
from raylab.envs.tasks.legged_joystick import LeggedRobot


@pytest.fixture(scope="module")
def model():
    return prototype()


def _standing(model):
    m = copy.copy(model)
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, m.key("home").id)
    mujoco.mj_forward(m, d)
    return m, d


def test_twelve_position_servos_in_leg_order_with_the_facts_limits(model):
    assert model.nu == 12 and model.nq == 19 and model.nv == 18
    assert ACTUATOR_NAMES[:3] == ("FR_hip", "FR_thigh", "FR_calf") and LEGS == (
        "FR",
        "FL",
        "RR",
        "RL",
    )
    for k, name in enumerate(ACTUATOR_NAMES):
        a = model.actuator(name)
        assert a.id == k
        j = model.joint(name)
        part = name.split("_")[1]
        front = name.startswith("F")
        expected = {
            "hip": (-1.047, 1.047),
            "thigh": (-1.571, 3.491) if front else (-0.524, 4.538),
            "calf": (-2.723, -0.838),
        }[part]
        np.testing.assert_allclose(j.range, expected)
        np.testing.assert_allclose(a.ctrlrange, expected)  # targets limited to the joint range
        limit = 45.4 if part == "calf" else 23.7
        np.testing.assert_allclose(a.forcerange, (-limit, limit))
        assert a.gainprm[0] == 50.0 and a.biasprm[1] == -50.0 and a.biasprm[2] == -0.5  # kp, kd


def test_dimensions_and_masses(model):
    assert model.body("trunk").mass[0] == pytest.approx(6.9)
    assert model.geom("trunk").size.tolist() == pytest.approx([0.19, 0.047, 0.057])
    for leg in LEGS:
        sx = 1 if leg[0] == "F" else -1
        sy = 1 if leg[1] == "L" else -1
        np.testing.assert_allclose(model.body(f"{leg}_hip").pos, (sx * 0.1934, sy * 0.0465, 0))
        np.testing.assert_allclose(model.body(f"{leg}_thigh").pos, (0, sy * 0.0955, 0))
        np.testing.assert_allclose(model.body(f"{leg}_calf").pos, (0, 0, -0.213))
        foot = model.geom(f"{leg}_foot")
        assert foot.type == mujoco.mjtGeom.mjGEOM_SPHERE and foot.size[0] == FOOT_RADIUS
        np.testing.assert_allclose(foot.pos, (0, 0, -0.213))
        assert model.body(f"{leg}_hip").mass[0] == pytest.approx(0.68)
        assert model.body(f"{leg}_thigh").mass[0] == pytest.approx(1.15)
        assert model.body(f"{leg}_calf").mass[0] == pytest.approx(0.24)
    assert model.body_subtreemass[model.body("trunk").id] == pytest.approx(15.18)


def test_only_primitives_and_only_robot_floor_contacts(model):
    allowed = {
        int(t)
        for t in (
            mujoco.mjtGeom.mjGEOM_BOX,
            mujoco.mjtGeom.mjGEOM_CAPSULE,
            mujoco.mjtGeom.mjGEOM_SPHERE,
        )
    }
    floor = model.geom("floor").id
    for g in range(model.ngeom):
        if g == floor:
            assert model.geom_type[g] == mujoco.mjtGeom.mjGEOM_PLANE and model.geom_priority[g] == 1
            continue
        assert int(model.geom_type[g]) in allowed
        assert model.geom_contype[g] == 1 and model.geom_conaffinity[g] == 0  # floor only


def test_home_keyframe_targets_the_home_pose_at_about_027_m(model):
    key = model.key("home")
    np.testing.assert_allclose(key.ctrl, np.tile(HOME_POSE, 4))
    assert 0.25 <= key.qpos[2] <= 0.29
    robot = LeggedRobot.of(model, ACTUATOR_NAMES, LEGS, "home")
    np.testing.assert_allclose(robot.default, np.tile(HOME_POSE, 4))
    assert np.abs(key.qpos[7:] - np.tile(HOME_POSE, 4)).max() < 0.2  # servo sag only


def test_holding_home_it_stands_still_for_20_s(model):
    m, d = _standing(model)
    start = d.qpos.copy()
    mujoco.mj_step(m, d, int(round(20.0 / m.opt.timestep)))
    assert abs(d.qpos[2] - start[2]) < 1e-3
    assert np.linalg.norm(d.qpos[:2] - start[:2]) < 1e-3
    assert np.abs(d.qpos[7:] - start[7:]).max() < 1e-3
    assert np.abs(d.qvel).max() < 1e-3
    touch = np.array([d.sensor(f"{leg}_foot_touch").data[0] for leg in LEGS])
    assert (touch > TASK.contact_force).all()
    # the four feet carry the robot's weight
    assert touch.sum() == pytest.approx(m.body_subtreemass[1] * 9.81, rel=0.02)
    for leg in LEGS:
        assert d.sensor(f"{leg}_foot_pos").data[2] - FOOT_RADIUS == pytest.approx(0.0, abs=2e-3)


def test_a_fallen_robot_rests_on_the_floor(model):
    m, d = _standing(model)
    d.qpos[2] = 0.4
    d.qpos[3:7] = (0.0, 1.0, 0.0, 0.0)  # upside down
    mujoco.mj_step(m, d, 1000)
    assert 0.03 < d.qpos[2] < 0.3  # on its back, not through the floor
    assert np.abs(d.qvel[:3]).max() < 0.5


def test_servo_targets_without_load_are_reached(model):
    m, d = _standing(model)
    m.opt.gravity[:] = 0.0
    d.qpos[2] = 1.0  # floating, no load on the legs
    target = np.tile((0.2, 1.2, -1.5), 4)
    d.ctrl[:] = target
    mujoco.mj_step(m, d, 500)
    q = d.qpos[7:]
    assert np.abs(q - target).max() < 0.05
