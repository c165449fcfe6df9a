"""The bit-equality contract: reference env == batched env, compared with ``==``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raylab.envs import contract
from raylab.envs.contract import (
    CASES,
    Case,
    case_actions,
    case_params,
    compare,
    run_batched,
    run_reference,
)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_and_batched_are_bit_identical(case):
    c = contract.run_case(case, steps=250, num_threads=2)
    assert c.episodes == case.episodes
    assert c.observations == case.episodes * 251  # the reset observation and 250 steps
    assert c.bit_identical, c.first_mismatch
    assert c.max_abs_obs_diff == 0.0 and c.max_abs_reward_diff == 0.0


def test_the_cases_cover_what_the_contract_promises():
    assert sum(c.episodes for c in CASES) >= 25
    opts = [c.options for c in CASES]
    assert {o.get("reward_version") for o in opts} == {"v1", "v2"}
    assert {o.get("latency_steps", 0) for o in opts} >= {0, 2}
    assert {o.get("init_noise", 0.02) > 0 for o in opts} == {True, False}
    assert any(o.get("num_pushes") == 5 and o.get("action_scale") == 0.5 for o in opts)
    assert {o.get("variant", "default") for o in opts} == {"default", "backlash", "toes"}
    assert sum(c.domain is not None for c in CASES) >= 2
    assert any(c.action_amplitude > 1.0 for c in CASES)  # the clip is compared too


def _one_case_records(case, shift_push=False):
    params = case_params(case)
    actions = case_actions(case, 250)
    ref = run_reference(case.options, params, actions)
    replay = [p.copy() for p in params]
    if shift_push:
        replay[0].push_steps[0] += 1
    return ref, run_batched(case.options, replay, actions)


def test_shifting_one_push_by_one_step_is_detected():
    case = Case("push shift", {"reward_version": "v2", "init_noise": 0.0}, 1, 42, 0.0)
    ref, same = _one_case_records(case)
    assert compare(ref, same).bit_identical
    ref, shifted = _one_case_records(case, shift_push=True)
    c = compare(ref, shifted)
    assert not c.bit_identical
    assert c.identical_observations < c.observations
    assert c.info_mismatches > 0  # the "pushed" flag moved


def test_a_single_last_bit_difference_is_detected():
    case = Case("one bit", {"reward_version": "v1"}, 1, 5, 0.3)
    ref, batched = _one_case_records(case)
    obs = batched["obs"][100][0]
    obs[3] = np.nextafter(obs[3], np.float32(np.inf))
    c = compare(ref, batched)
    assert c.observations - c.identical_observations == 1
    assert 0.0 < c.max_abs_obs_diff < 1e-6


def test_row_reductions_sum_like_the_reference_1d_reduction():
    # The batched rewards take means over the last axis of (N, 14) arrays; the reference takes
    # them over (14,) arrays. These inputs sum differently sequentially and pairwise.
    x = np.array([1e16] + [1.0] * 7 + [-1e16] + [0.0] * 5)
    assert sum(x.tolist()) != np.sum(x)  # the orders really differ here
    rows = np.stack([x, x[::-1], np.roll(x, 3)])
    for r, m in zip(rows, np.mean(rows, axis=1)):
        assert np.mean(r) == m
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2000, 14)) * np.exp(rng.uniform(-30, 30, (2000, 14)))
    batched = np.mean(np.ascontiguousarray(big * big), axis=1)
    assert all(np.mean(r * r) == b for r, b in zip(big, batched))


def test_report_command_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "contract.json"
    rc = contract.main(["--out", str(out), "--steps", "20", "--threads", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "bit-identical" in text and "max abs diff" in text and "PASS" in text
    report = json.loads(out.read_text())
    total = report["total"]
    assert total["episodes"] == sum(c.episodes for c in CASES)
    assert total["observations"] == total["identical_observations"] == total["episodes"] * 21
    assert total["max_abs_obs_diff"] == 0.0
    assert len(report["cases"]) == len(CASES)


# The contract must notice the arithmetic details that decide the last bit. Each test below
# makes the batched env deviate in one of them and checks the comparison fails.

_V1 = next(c for c in CASES if c.name == "v1")


def test_a_sequential_sum_instead_of_numpys_pairwise_mean_is_detected(monkeypatch):
    # Both envs call the task's term functions (the reference on its one robot's state as one
    # row): the batched env's N rows, summed one by one, must differ from numpy's pairwise mean.
    from raylab.envs.tasks import microduck_balance as mb  # where the reward terms live

    real = mb.mean_square

    def sequential_when_batched(x):
        if len(x) == 1:  # the reference env's row
            return real(x)
        return np.array([sum((r * r).tolist()) / r.size for r in x])

    monkeypatch.setattr(mb, "mean_square", sequential_when_batched)
    c = contract.run_case(_V1)
    assert c.identical_rewards < c.rewards


def test_a_float64_observation_scale_is_detected(monkeypatch):
    from raylab.envs.core import managers, vec_env

    class Float64Scale(managers.ObservationManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.scale = np.array([float(f"{s:.6g}") for s in self.scale])  # 0.05, not 0.05f

    monkeypatch.setattr(vec_env, "ObservationManager", Float64Scale)
    c = contract.run_case(_V1)
    assert c.identical_observations < c.observations


def test_skipping_the_post_step_mj_forward_is_detected(monkeypatch):
    import mujoco

    from raylab.envs.core.backend import BatchedMujoco

    def step_without_forward(self, k):
        for i in self._owned[k]:
            if self._in_active[i]:
                self._ctrl[i][:] = self._in_ctrl[i]
                if self._in_kick_mask[i]:
                    self._qvel[i][self.kick_dofs] += self._in_kick[i]
                mujoco.mj_step(self.models[i], self.datas[i], self.nsubsteps)
                self.sensordata[i] = self._sensordata[i]

    monkeypatch.setattr(BatchedMujoco, "_step_owned", step_without_forward)
    c = contract.run_case(_V1)
    assert c.identical_observations < c.observations
