"""`raylab plot RUN_DIR [RUN_DIR ...]`: learning curves as a picture.

``Train/mean_reward`` (the reward window) and ``Eval/mean_reward`` (the evaluations during
training) against env steps, read back from each run's event files with raylab's metric
reader. Several runs of one config (seeds) are drawn as their mean with a band of +/- one
standard deviation, over the env steps every run reached. For raylab's robot tasks the
hold-pose (zero action) and random-action scores are horizontal lines (on a task that pushes
the robot also hold-pose without pushes, and the headroom taken on the right axis), computed by the
evaluation code on the runs' task with the evaluation protocol (``raylab.evaluate.
baseline_scores``, cached). The title names the task, the algorithm, the runs and their budget.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from raylab.errors import UserError
from raylab.metrics import schema as S

GRID_POINTS = 200


def _series(table, tag: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    try:
        points = table.column(tag)
    except (KeyError, ValueError):
        return None
    points = [(s, v) for s, v in points if v is not None and np.isfinite(v)]
    if not points:
        return None
    steps, values = zip(*points)
    return np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)


def mean_and_spread(curves: Sequence[Tuple[np.ndarray, np.ndarray]], points: int = GRID_POINTS):
    """Curves (steps, values) -> (grid, mean, sd) over the steps every curve covers. One curve
    comes back at its own points (sd 0)."""
    if len(curves) == 1:
        steps, values = curves[0]
        return steps, values, np.zeros_like(values)
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    if hi <= lo:
        raise UserError("the runs' curves do not overlap in env steps; plot them one at a time")
    grid = np.linspace(lo, hi, points)
    stack = np.stack([np.interp(grid, s, v) for s, v in curves])
    return grid, stack.mean(axis=0), stack.std(axis=0, ddof=1)


def _budget(cfg) -> str:
    t = cfg.training
    parts = []
    if t.time_budget_s is not None:
        parts.append(f"{t.time_budget_s / 60:g} min")
    if t.total_steps < 10**12:
        parts.append(f"{t.total_steps / 1e6:g} M steps")
    return " / ".join(parts) or "no budget"


def plot_runs(run_dirs: Sequence[str], out: Optional[str] = None, baselines: bool = True) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from raylab.metrics.extract import extract
    from raylab.train import load_run_config

    if not run_dirs:
        raise UserError("raylab plot: name at least one run directory")
    runs = [Path(d) for d in run_dirs]
    cfgs = [load_run_config(r) for r in runs]
    kinds = {(c.task, c.algo.name) for c in cfgs}
    if len(kinds) > 1:
        found = ", ".join(f"{t}/{a}" for t, a in sorted(kinds))
        raise UserError(f"raylab plot draws runs of one task and algorithm; got {found}")
    cfg = cfgs[0]
    curves: Dict[str, List[Tuple[np.ndarray, np.ndarray]]] = {
        S.TRAIN_MEAN_REWARD: [],
        S.EVAL_MEAN_REWARD: [],
    }
    for run in runs:
        table = extract(run)
        for tag in curves:
            series = _series(table, tag)
            if series is not None:
                curves[tag].append(series)
    if not curves[S.TRAIN_MEAN_REWARD] and not curves[S.EVAL_MEAN_REWARD]:
        raise UserError(
            f"no {S.TRAIN_MEAN_REWARD} or {S.EVAL_MEAN_REWARD} in {', '.join(map(str, runs))}"
        )

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    styles = {
        S.TRAIN_MEAN_REWARD: ("tab:blue", "-", None),
        S.EVAL_MEAN_REWARD: ("tab:orange", "-", "o"),
    }
    for tag, found in curves.items():
        if not found:
            continue
        color, line, marker = styles[tag]
        grid, mean, sd = mean_and_spread(found)
        label = f"{tag} (mean of {len(found)})" if len(found) > 1 else tag
        ax.plot(grid, mean, line, color=color, marker=marker, markersize=3, label=label)
        if len(found) > 1:
            ax.fill_between(grid, mean - sd, mean + sd, color=color, alpha=0.2, linewidth=0)
    from raylab.envs.tasks import TASKS

    if baselines and cfg.task in TASKS:
        from raylab.evaluate import baseline_scores

        scores = baseline_scores(
            cfg, episodes=int(cfg.training.eval_episodes), seed=int(cfg.training.eval_seed)
        )
        lines = (("hold_pose", "--", "hold-pose"), ("random", ":", "random"))
        lines += (("no_push", "-.", "hold-pose, no pushes"),) if "no_push" in scores else ()
        for name, style, text in lines:
            value = scores[name]["mean_return"]
            ax.axhline(
                value,
                color="0.35",
                linestyle=style,
                linewidth=1.2,
                label=f"{text} {value:.1f} ({int(cfg.training.eval_episodes)} eval episodes)",
            )
        if "no_push" in scores:  # the task's yardstick on the right: 0 at hold-pose, 1 unpushed
            hold, top = scores["hold_pose"]["mean_return"], scores["no_push"]["mean_return"]
            span = top - hold
            right = ax.secondary_yaxis(
                "right", functions=(lambda r: (r - hold) / span, lambda h: hold + h * span)
            )
            right.set_ylabel("headroom taken")
    seeds = sorted({int(c.training.seed) for c in cfgs})
    ax.set_title(
        f"{cfg.task} · {cfg.algo.name.upper()} · {len(runs)} run(s), seeds "
        f"{', '.join(map(str, seeds))} · budget {_budget(cfg)}",
        fontsize=10,
    )
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = (
        Path(out)
        if out
        else (runs[0] / "learning_curve.png" if len(runs) == 1 else Path("learning_curve.png"))
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"raylab: wrote {path}", file=sys.stderr)
    return path
