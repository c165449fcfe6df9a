"""The bit-equality contract between the reference Microduck env and the batched env.

Each case draws episodes with the reference env (``reset(seed=...)`` returns them in
``info["episode_params"]``), replays the same :class:`EpisodeParams` in a batched env
(``reset(options={"episode_params": [...]})``), feeds both the same 250 actions, and compares
everything that comes back with ``==`` and no tolerance: observations, rewards, terminated,
truncated, per-term rewards and the info flags (trunk height, upright cosine, fallen, pushed,
step index).

``python -m raylab.envs.contract`` runs every case, prints the equality table and writes it as
JSON (``--out``, default ``runs/contract/microduck_contract.json``); it exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mujoco
import numpy as np

from raylab.envs.reference.microduck_balance import MicroduckBalanceEnv
from raylab.envs.robots.microduck import NUM_ACTIONS, SERVO_FITS, DomainParams
from raylab.envs.tasks.microduck_balance import EpisodeParams, MicroduckBalanceVecEnv

INFO_FLAGS = ("trunk_height", "upright_cos", "fallen", "pushed", "step")


@dataclass(frozen=True)
class Case:
    """One comparison: ``episodes`` envs of one configuration, drawn from seeds seed, seed+1, ..."""

    name: str
    options: Dict[str, Any]
    episodes: int
    seed: int
    action_amplitude: float = 1.0  # actions uniform in [-a, a]; a > 1 exercises the clip
    domain: Optional[str] = None  # "low" / "high": inject these DR factors into the params


def _injected_domain(which: str, nbody: int) -> DomainParams:
    pick = min if which == "low" else max
    servo = {k: float(pick(v)) for k, v in SERVO_FITS.items()}
    scale = np.full(nbody, 0.85 if which == "low" else 1.15)
    scale[0] = 1.0
    return DomainParams(**servo, mass_scale=scale, friction_scale=0.6 if which == "low" else 1.2)


# 27 episodes: both reward versions, latency 0 and 2, initial noise on and off, 5 pushes with
# action scale 0.5, both extra physics variants, two DR cases with injected factors, and sensor
# noise (replayed from the episode's noise seed).
CASES: Sequence[Case] = (
    Case("v2", {"reward_version": "v2"}, 3, 100),
    Case("v1", {"reward_version": "v1"}, 3, 200, action_amplitude=0.3),
    Case("v2 latency 2", {"reward_version": "v2", "latency_steps": 2}, 2, 300),
    Case("v1 latency 2", {"reward_version": "v1", "latency_steps": 2}, 2, 400),
    Case("v2 no initial noise", {"reward_version": "v2", "init_noise": 0.0}, 2, 500, 0.3),
    Case("v1 no initial noise", {"reward_version": "v1", "init_noise": 0.0}, 2, 600),
    Case(
        "5 pushes, action scale 0.5",
        {"reward_version": "v2", "num_pushes": 5, "action_scale": 0.5},
        3,
        700,
        action_amplitude=1.2,
    ),
    Case("variant backlash", {"reward_version": "v1", "variant": "backlash"}, 2, 800, 0.3),
    Case("variant toes", {"reward_version": "v2", "variant": "toes"}, 2, 900),
    Case(
        "DR injected low",
        {"reward_version": "v2", "domain_randomization": True},
        2,
        1000,
        0.3,
        "low",
    ),
    Case(
        "DR injected high",
        {"reward_version": "v1", "domain_randomization": True},
        2,
        1100,
        1.0,
        "high",
    ),
    Case("sensor noise", {"reward_version": "v2", "sensor_noise": True}, 2, 1200, 0.3),
    Case(
        "v2 reweighted, v1 terms added",
        {"reward_version": "v2", "rew_height": 0.5, "rew_posture": -0.1, "rew_effort": -0.02},
        2,
        1300,
        0.3,
    ),
)


def case_params(case: Case) -> List[EpisodeParams]:
    """Draw the case's episodes with the reference env (and inject DR factors if asked)."""
    env = MicroduckBalanceEnv(**case.options)
    params = []
    for i in range(case.episodes):
        _, info = env.reset(seed=case.seed + i)
        p = info["episode_params"]
        if case.domain is not None:
            p.domain = _injected_domain(case.domain, env.robot.nbody)
            p.latency = 1 if case.domain == "low" else 2
        params.append(p)
    return params


def case_actions(case: Case, steps: int) -> np.ndarray:
    rng = np.random.default_rng(case.seed + 12345)
    a = case.action_amplitude
    return rng.uniform(-a, a, size=(steps, case.episodes, NUM_ACTIONS))


def run_reference(options: Dict[str, Any], params: Sequence[EpisodeParams], actions: np.ndarray):
    """Each episode on its own reference env; returns per-episode lists of per-step records."""
    out = []
    for i, p in enumerate(params):
        env = MicroduckBalanceEnv(**options)
        obs, info = env.reset(options={"episode_params": p})
        rec = {
            "obs": [obs],
            "reward": [],
            "terminated": [],
            "truncated": [],
            "terms": [],
            "info": [{k: info[k] for k in INFO_FLAGS if k in info}],
        }
        for t in range(actions.shape[0]):
            obs, r, term, trunc, info = env.step(actions[t, i])
            rec["obs"].append(obs)
            rec["reward"].append(r)
            rec["terminated"].append(term)
            rec["truncated"].append(trunc)
            rec["terms"].append(info["reward_terms"])
            rec["info"].append({k: info[k] for k in INFO_FLAGS})
        out.append(rec)
    return out


def run_batched(
    options: Dict[str, Any],
    params: Sequence[EpisodeParams],
    actions: np.ndarray,
    num_threads: int = 2,
    allow_overcommit: bool = True,
):
    """All episodes as the envs of one batched env (info_mode="full")."""
    env = MicroduckBalanceVecEnv(
        num_envs=len(params),
        num_threads=num_threads,
        allow_overcommit=allow_overcommit,
        info_mode="full",
        **options,
    )
    try:
        obs, info = env.reset(options={"episode_params": list(params)})
        rec = {
            "obs": [obs],
            "reward": [],
            "terminated": [],
            "truncated": [],
            "terms": [],
            "info": [{k: info[k] for k in INFO_FLAGS}],
        }
        for t in range(actions.shape[0]):
            obs, r, term, trunc, info = env.step(actions[t])
            rec["obs"].append(obs)
            rec["reward"].append(r)
            rec["terminated"].append(term)
            rec["truncated"].append(trunc)
            rec["terms"].append(info["reward_terms"])
            rec["info"].append({k: info[k] for k in INFO_FLAGS})
        return rec
    finally:
        env.close()


@dataclass
class Comparison:
    episodes: int = 0
    observations: int = 0
    identical_observations: int = 0
    max_abs_obs_diff: float = 0.0
    rewards: int = 0
    identical_rewards: int = 0
    max_abs_reward_diff: float = 0.0
    flag_mismatches: int = 0  # terminated / truncated
    term_mismatches: int = 0  # per-term reward values
    info_mismatches: int = 0  # trunk height, upright cosine, fallen, pushed, step
    first_mismatch: Optional[str] = None

    @property
    def bit_identical(self) -> bool:
        return (
            self.identical_observations == self.observations
            and self.identical_rewards == self.rewards
            and self.flag_mismatches == 0
            and self.term_mismatches == 0
            and self.info_mismatches == 0
        )

    def add(self, other: "Comparison") -> None:
        for name in (
            "episodes",
            "observations",
            "identical_observations",
            "rewards",
            "identical_rewards",
            "flag_mismatches",
            "term_mismatches",
            "info_mismatches",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs_obs_diff = max(self.max_abs_obs_diff, other.max_abs_obs_diff)
        self.max_abs_reward_diff = max(self.max_abs_reward_diff, other.max_abs_reward_diff)
        self.first_mismatch = self.first_mismatch or other.first_mismatch

    def as_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["bit_identical"] = self.bit_identical
        return d


def compare(ref, batched) -> Comparison:
    """Compare reference records (one per episode) with the batched record, with ``==``."""
    c = Comparison(episodes=len(ref))

    def miss(what: str):
        if c.first_mismatch is None:
            c.first_mismatch = what

    for i, r in enumerate(ref):
        for t, o in enumerate(r["obs"]):
            b = batched["obs"][t][i]
            c.observations += 1
            if np.array_equal(o, b):
                c.identical_observations += 1
            else:
                diff = float(np.max(np.abs(o.astype(np.float64) - b.astype(np.float64))))
                c.max_abs_obs_diff = max(c.max_abs_obs_diff, diff)
                miss(f"episode {i} observation {t}")
            for k in INFO_FLAGS:
                if k in r["info"][t] and r["info"][t][k] != batched["info"][t][k][i]:
                    c.info_mismatches += 1
                    miss(f"episode {i} step {t} info {k}")
        for t, rew in enumerate(r["reward"]):
            c.rewards += 1
            b = batched["reward"][t][i]
            if rew == b:
                c.identical_rewards += 1
            else:
                c.max_abs_reward_diff = max(c.max_abs_reward_diff, abs(rew - b))
                miss(f"episode {i} reward {t}")
            if (
                r["terminated"][t] != batched["terminated"][t][i]
                or r["truncated"][t] != batched["truncated"][t][i]
            ):
                c.flag_mismatches += 1
                miss(f"episode {i} step {t} terminated/truncated")
            rt, bt = r["terms"][t], batched["terms"][t]
            if set(rt) != set(bt) or any(rt[k] != bt[k][i] for k in rt):
                c.term_mismatches += 1
                miss(f"episode {i} step {t} reward terms")
    return c


def run_case(case: Case, steps: int = 250, num_threads: int = 2) -> Comparison:
    params = case_params(case)
    actions = case_actions(case, steps)
    return compare(
        run_reference(case.options, params, actions),
        run_batched(case.options, params, actions, num_threads=num_threads),
    )


def run_contract(cases: Sequence[Case] = CASES, steps: int = 250, num_threads: int = 2):
    rows, total = [], Comparison()
    for case in cases:
        t0 = time.perf_counter()
        c = run_case(case, steps, num_threads)
        rows.append(
            {
                "case": case.name,
                "options": case.options,
                "seconds": time.perf_counter() - t0,
                **c.as_dict(),
            }
        )
        total.add(c)
    return rows, total


def format_table(rows, total: Comparison) -> str:
    head = (
        f"{'case':<28} {'episodes':>8} {'obs compared':>12} {'bit-identical':>13} "
        f"{'max abs diff':>12} {'max rew diff':>12} {'info/term/flag':>14}"
    )
    lines = [head, "-" * len(head)]

    def line(name, c):
        mism = f"{c['info_mismatches']}/{c['term_mismatches']}/{c['flag_mismatches']}"
        return (
            f"{name:<28} {c['episodes']:>8} {c['observations']:>12,} "
            f"{c['identical_observations']:>13,} {c['max_abs_obs_diff']:>12.1e} "
            f"{c['max_abs_reward_diff']:>12.1e} {mism:>14}"
        )

    for r in rows:
        lines.append(line(r["case"], r))
    lines.append("-" * len(head))
    lines.append(line("total", total.as_dict()))
    pct = 100.0 * total.identical_observations / max(total.observations, 1)
    lines.append(
        f"{total.identical_observations:,} / {total.observations:,} observations bit-identical "
        f"({pct:.2f}%), {total.identical_rewards:,} / {total.rewards:,} rewards; "
        f"{'PASS' if total.bit_identical else 'FAIL'}"
    )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m raylab.envs.contract",
        description="Reference vs batched Microduck env: the bit-equality table.",
    )
    ap.add_argument("--out", default="runs/contract/microduck_contract.json", help="JSON path")
    ap.add_argument("--threads", type=int, default=2, help="physics threads of the batched env")
    ap.add_argument("--steps", type=int, default=250, help="control steps per episode")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows, total = run_contract(CASES, args.steps, args.threads)
    print(format_table(rows, total))
    report = {
        "command": "python -m raylab.envs.contract "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps_per_episode": args.steps,
        "num_threads": args.threads,
        "cases": rows,
        "total": total.as_dict(),
        "seconds": time.perf_counter() - t0,
        "mujoco": mujoco.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0 if total.bit_identical else 1


if __name__ == "__main__":
    sys.exit(main())
