"""raylab PPO / SAC on Gymnasium MuJoCo ids against the reference implementations' returns.

    python benchmarks/parity/run.py --algo ppo --tasks HalfCheetah-v5 Walker2d-v5 \
        --steps 1000000 --seeds 0 1 [-- KEY=VALUE ...]
    python benchmarks/parity/run.py --report

A run per (algo, task, seed): ``raylab train`` with ``training.total_steps`` = ``--steps``, no
evaluation (the reference figures are training returns) and ``training.episode_log`` on, into
``runs/parity/NAME`` (ignored by git; its log next to it), NAME = ``<algo>_<task>_s<seed>`` plus
``--tag``. Every finished training episode is read back from the run's ``episodes.csv``, and
two curves are made from them, one per definition the reference uses:

- ``window``: the mean return of the episodes that ended within 5,000 env steps either side of
  a step (one-sided at the end of the run). The reference's curves are plotted that way: each
  run's episodic returns interpolated onto 10,000 points of its 1M-step axis, then a centred
  rolling mean over 100 points, i.e. 10,000 env steps. Its curve points are compared with this.
- ``last100``: the mean of the latest 100 episodes (``Train/mean_reward``), the definition of
  the reference's 1M-step tables. Early in a run with long episodes it averages most of the
  run (at 100k env steps, 100 HalfCheetah episodes are the whole run).

Saved to ``benchmarks/parity/results/NAME.json`` with the episodes, the command, the overrides,
the wall time and the machine (cores, load before and after, what else was busy).
``--stop-after-min M`` stops a run gracefully after M minutes (a final checkpoint; a run that
has not finished its first iteration by then is stopped after it) and ``--resume`` continues it
to its budget later (SAC with ``algo.store_buffer_in_checkpoints=true`` goes on with its replay);
the result's wall time is the sum of the segments, each listed.

``--report`` reads every saved result and prints the parity table (task, algorithm, steps,
raylab mean +/- sd over seeds at each reference point by both definitions, the reference, wall
time per run against the reference's) into ``benchmarks/parity/results/table.md``, and draws one
plot per task and algorithm (``<algo>_<task>.png``): raylab's curves per seed and the
reference's points (+/-10%, the accuracy they were read with). The reference figures and their
source: ``benchmarks/parity/references.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RUNS = REPO / "runs" / "parity"
RESULTS = HERE / "results"
RAYLAB = str(Path(sys.executable).with_name("raylab"))


def references() -> Dict[str, Dict[str, dict]]:
    data = json.loads((HERE / "references.json").read_text())
    data.pop("_about", None)
    return data


def family(task: str) -> str:
    """``HalfCheetah-v5`` -> ``HalfCheetah`` (the references are per task, any version)."""
    return task.split("-v")[0]


HALF_WINDOW = 5_000  # env steps either side: the reference's plot smoothing (see above)


def episodes_of(run: Path) -> List[List[float]]:
    """[(env steps when its iteration ended, return)] of every training episode of a run."""
    from raylab.metrics.rundir import RunDirectory

    return [[steps, ret] for steps, _, ret, _ in RunDirectory(run).read_episodes()]


def last100(episodes: List[List[float]], step: int) -> Optional[float]:
    """Mean return of the latest 100 episodes ended at or before ``step``."""
    before = [r for s, r in episodes if s <= step][-100:]
    return sum(before) / len(before) if before else None


def window(episodes: List[List[float]], step: int) -> Optional[float]:
    """Mean return of the episodes that ended within HALF_WINDOW env steps of ``step``."""
    near = [r for s, r in episodes if abs(s - step) <= HALF_WINDOW]
    return sum(near) / len(near) if near else None


def value_at(result: dict, step: int, how) -> Optional[float]:
    """A run's training return at ``step`` by ``how`` (:func:`window` or :func:`last100`);
    None when the run stopped more than 2% short of ``step``."""
    episodes = result.get("episodes") or []
    if not episodes or result["env_steps"] < 0.98 * step:
        return None
    return how(episodes, step)


def curve(episodes: List[List[float]], how, points: int = 200) -> List[List[float]]:
    """``how`` at ``points`` evenly spaced steps over the run (for the plot)."""
    if not episodes:
        return []
    end = episodes[-1][0]
    steps = [end * (k + 1) // points for k in range(points)]
    return [[s, v] for s in steps if (v := how(episodes, s)) is not None]


def _env_steps(run: Path) -> int:
    """The env steps the run's driver last wrote to its summary (0 before its first)."""
    try:
        return int(json.loads((run / "run_summary.json").read_text()).get("env_steps") or 0)
    except (OSError, ValueError):
        return 0  # not written yet, or being replaced


def _stop_after_first_iteration(proc, run: Path, start_steps: int, name: str) -> Optional[int]:
    """At the stop time, wait (saying so) until the run has reported an iteration of this
    segment: a stop before it would leave nothing to resume from. The run's exit code when it
    ends meanwhile, else None (stop it now)."""
    said = False
    while _env_steps(run) <= start_steps:
        if not said:
            print(f"== {name}: no iteration yet; waiting for the first before stopping", flush=True)
            said = True
        try:
            return proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    return None


def train_one(
    algo: str,
    task: str,
    seed: int,
    steps: int,
    tag: str,
    overrides: List[str],
    stop_after_min: Optional[float] = None,
    resume: bool = False,
) -> dict:
    """Train one run (or, with ``resume``, continue a stopped one to its budget) and save its
    result. ``stop_after_min``: stop the run gracefully (SIGTERM: a final checkpoint) after
    that many minutes; ``--resume`` continues it later, and the result adds up the segments."""
    from raylab.bench.common import busy_processes, machine_info

    name = f"{algo}_{task}_s{seed}{tag}"
    run = RUNS / name
    earlier: List[dict] = []
    if resume:
        saved = RESULTS / f"{name}.json"
        if not run.is_dir() or not saved.is_file():
            raise SystemExit(f"--resume: no stopped run {run} with a result {saved}")
        before_result = json.loads(saved.read_text())
        earlier = before_result.get("segments", [])
        overrides = before_result["overrides"]  # the stopped run's, whatever is passed now
    elif run.exists():
        raise SystemExit(f"{run} exists; remove it or pass another --tag")
    RUNS.mkdir(parents=True, exist_ok=True)
    train = [
        RAYLAB,
        "train",
        "--algo",
        algo,
        "--task",
        task,
        f"training.log_dir={run}",
        f"training.seed={seed}",
        f"training.total_steps={steps}",
        "training.time_budget_s=null",
        "training.eval_every=0",
        "training.eval_before_train=false",
        "training.episode_log=true",
        "training.terminal=plain",
        "resources.dashboard=false",
        *overrides,
    ]
    command = [RAYLAB, "train", "--resume", str(run)] if resume else train
    print(f"== {' '.join(shlex.quote(x) for x in command)}", flush=True)
    before = {"machine": machine_info(), "busy": busy_processes()}
    t0 = time.time()
    with open(RUNS / f"{name}.log", "a" if resume else "w") as log:
        start_steps = _env_steps(run)
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=None if stop_after_min is None else 60 * stop_after_min)
        except subprocess.TimeoutExpired:
            rc = _stop_after_first_iteration(proc, run, start_steps, name)
            if rc is None:
                print(f"== {name}: stopping after {stop_after_min} min (SIGTERM)", flush=True)
                proc.send_signal(signal.SIGTERM)  # a graceful stop: the final checkpoint
                rc = proc.wait()
    wall = time.time() - t0
    summary = json.loads((run / "run_summary.json").read_text())
    segments = earlier + [
        {"command": command[1:], "wall_s": round(wall, 1), "status": summary.get("status")}
    ]
    wall = sum(seg["wall_s"] for seg in segments)
    episodes = episodes_of(run)
    result = {
        "name": name,
        "command": "python " + " ".join(shlex.quote(x) for x in sys.argv),
        "train_command": train[1:],
        "overrides": overrides,
        "returncode": rc,
        "algo": algo,
        "task": task,
        "seed": seed,
        "steps": steps,
        "wall_s": round(wall, 1),
        "segments": segments,
        "time_total_s": summary.get("time_total_s"),
        "env_steps": summary.get("env_steps"),
        "status": summary.get("status"),
        "episodes": episodes,
        "machine_before": before["machine"],
        "busy_at_start": before["busy"],
        "machine_after": machine_info(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    end = result["env_steps"] or 0
    final = [f(episodes, end) for f in (window, last100)]
    print(
        f"== {name}: {end:,} env steps in {wall / 60:.1f} min, training return "
        + " / ".join("-" if v is None else f"{v:.0f}" for v in final)
        + f" (episodes of the last 5,000 steps / last 100 episodes); {RESULTS / (name + '.json')}",
        flush=True,
    )
    return result


def _at(result: dict, step: int, how) -> Optional[float]:
    """:func:`value_at`, and for a result saved before the episode log (only its
    ``Train/mean_reward`` curve, the last-100 definition) that curve's value."""
    if "episodes" in result:
        return value_at(result, step, how)
    old = result.get("curve") or []
    before = [v for s, v in old if s <= step]
    if how is not last100 or not before or old[-1][0] < 0.98 * step:
        return None
    return before[-1]


def _cell(values: List[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):,.0f} +/- {sd:,.0f} ({len(values)})"


# Overrides that change how fast a run goes, not what it learns: runs that differ only in
# these are seeds of one configuration in the table and the plots.
SPEED_ONLY = ("algo.learner_threads=",)


def learning_overrides(overrides) -> tuple:
    """``overrides`` without the speed-only ones (:data:`SPEED_ONLY`)."""
    return tuple(o for o in overrides if not o.startswith(SPEED_ONLY))


def report() -> str:
    refs = references()
    groups: Dict[tuple, List[dict]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        if "episodes" not in r and "curve" not in r:
            continue
        key = (r["algo"], r["task"], learning_overrides(r.get("overrides") or ()))
        groups.setdefault(key, []).append(r)
    lines = [
        "| task | algorithm | overrides | env steps | raylab, episodes within 5k steps (mean +/- "
        "sd, seeds) | raylab, last 100 episodes | reference | raylab wall time per run "
        "| reference wall time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (algo, task, overrides), runs in sorted(groups.items()):
        ref = refs.get(algo, {}).get(family(task), {})
        points = sorted(int(s) for s in ref.get("curve", {})) or [max(r["steps"] for r in runs)]
        for step in points:
            near = [v for v in (_at(r, step, window) for r in runs) if v is not None]
            last = [v for v in (_at(r, step, last100) for r in runs) if v is not None]
            if not near and not last:
                continue
            walls = [r["wall_s"] * step / max(r["env_steps"], 1) / 60 for r in runs]
            ref_value = ref.get("curve", {}).get(str(step))
            ref_wall = ref.get("wall_min_per_1M")
            lines.append(
                f"| {task} | {algo} | {' '.join(overrides) or 'defaults'} | {step:,} "
                f"| {_cell(near)} | {_cell(last)} "
                f"| {f'{ref_value:,}' if ref_value is not None else '-'} "
                f"| {statistics.mean(walls):.1f} min "
                f"| {f'{ref_wall * step / 1e6:.1f} min' if ref_wall else '-'} |"
            )
        _plot(algo, task, overrides, runs, ref)
    table = "\n".join(lines) + "\n"
    (RESULTS / "table.md").write_text(table)
    return table


def _plot(algo: str, task: str, overrides: tuple, runs: List[dict], ref: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        episodes = r.get("episodes")
        if episodes is None:  # saved before the episode log: its last-100 curve only
            drawn = [(r.get("curve") or [], "last 100 episodes", "--")]
        else:
            drawn = [
                (curve(episodes, window), "episodes within 5k steps", "-"),
                (curve(episodes, last100), "last 100 episodes", ":"),
            ]
        for points, what, style in drawn:
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, style, lw=1.2, label=f"raylab seed {r['seed']}, {what}")
    points = sorted((int(s), v) for s, v in ref.get("curve", {}).items())
    if points:
        xs, ys = zip(*points)
        ax.errorbar(
            xs,
            ys,
            yerr=[0.1 * y for y in ys],
            fmt="ks",
            ms=4,
            capsize=3,
            label="reference (read off its plot, +/-10%)",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return")
    title = f"{algo.upper()} {task}" + (f" ({' '.join(overrides)})" if overrides else "")
    ax.set_title(textwrap.fill(title, 80), fontsize=8 if len(title) > 80 else 9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    suffix = (
        "" if not overrides else "_" + hashlib.sha1(" ".join(overrides).encode()).hexdigest()[:6]
    )
    fig.savefig(RESULTS / f"{algo}_{task}{suffix}.png", dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=("ppo", "appo", "sac"))
    p.add_argument("--tasks", nargs="+", default=[])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--tag", default="", help="appended to each run's name")
    p.add_argument(
        "--stop-after-min",
        type=float,
        default=None,
        help="stop each run gracefully after this many minutes (its final checkpoint; "
        "--resume continues it)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the stopped runs of these --algo/--tasks/--seeds/--tag to their budget",
    )
    p.add_argument("--report", action="store_true", help="table and plots of the saved results")
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    sys.path.insert(0, str(REPO))
    if not a.report:
        if not a.algo or not a.tasks:
            p.error("--algo and --tasks are needed to train (or --report)")
        for task in a.tasks:
            for seed in a.seeds:
                train_one(a.algo, task, seed, a.steps, a.tag, overrides, a.stop_after_min, a.resume)
    print(report(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
