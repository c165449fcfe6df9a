"""``raylab bench plot RESULT.json``: a small PNG of a benchmark result.

- env sweep: env-steps/s against threads (with the bare-physics line: the paired bare windows
  of a ``--with-bare`` sweep, or ``--bare`` naming a ``--mode bare`` sweep) and efficiency
  against threads, the ideal dashed; the verdict and load average in the title;
- sustained: env-steps/s per window, with the reference windows before and after;
- compare: env-steps/s per backend against workers;
- train: env-steps/s and updates/s per contender, and the learner phase shares.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from raylab.bench import common as C
from raylab.errors import UserError


def _title(res: Dict[str, Any], what: str) -> str:
    load = res["machine_check"]["loadavg"][0]
    after = res["loadavg_after"][0]
    return (
        f"{what} | {res['verdict']} | load {load:.2f}->{after:.2f} | "
        f"{res['machine']['usable_cores']} cores | {res['created'][:16]}"
    )


def _sweep(ax_rate, ax_eff, res: Dict[str, Any], bare: Optional[Dict[str, Any]]) -> None:
    rows = res["rows"]
    t = [r["threads"] for r in rows]
    label = "bare physics" if res["params"]["mode"] == "bare" else "batched env"
    ax_rate.plot(t, [r["env_steps_per_s"] for r in rows], "o-", label=label)
    ax_eff.plot(t, [r["efficiency"] for r in rows], "o-", label=label)
    if any("bare" in r for r in rows):
        b = [r for r in rows if "bare" in r]
        bt = [r["threads"] for r in b]
        rates = [r["bare"]["env_steps_per_s"] for r in b]
        ax_rate.plot(bt, rates, "s--", label="bare physics (paired windows)")
        one = next((x for x, tt in zip(rates, bt) if tt == 1), None)
        if one:
            ax_eff.plot(
                bt,
                [x / (one * tt) for x, tt in zip(rates, bt)],
                "s--",
                label="bare physics (paired windows)",
            )
    if bare is not None:
        br = bare["rows"]
        ax_rate.plot(
            [r["threads"] for r in br],
            [r["env_steps_per_s"] for r in br],
            "s--",
            label="bare physics (separate sweep)",
        )
        ax_eff.plot(
            [r["threads"] for r in br],
            [r["efficiency"] for r in br],
            "s--",
            label="bare physics (separate sweep)",
        )
    ax_eff.axhline(1.0, color="grey", lw=0.8, ls=":")
    for ax in (ax_rate, ax_eff):
        ax.set_xlabel("threads")
        ax.set_xticks(sorted(set(t)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_rate.set_ylabel("env-steps/s")
    ax_rate.set_ylim(bottom=0)
    ax_eff.set_ylabel("efficiency (speed-up / threads)")
    ax_eff.set_ylim(0, 1.15)


def plot_result(res: Dict[str, Any], out: Path, bare: Optional[Dict[str, Any]] = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = res["kind"]
    p = res["params"]
    if kind == "env_sweep":
        fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
        _sweep(a, b, res, bare)
        fig.suptitle(_title(res, f"{p['task']} N={p['num_envs']} {p['mode']} sweep"), fontsize=8)
    elif kind == "env_sustained":
        fig, a = plt.subplots(figsize=(8, 3.2))
        w = res["windows"]
        a.plot(
            [x["window"] for x in w],
            [x["env_steps_per_s"] for x in w],
            "o-",
            label=f"{p['threads']} threads",
        )
        refs = res["refs"]
        a.plot([-1, len(w)], [r["env_steps_per_s"] for r in refs], "s", label="1-thread reference")
        a.set_xlabel(f"window ({p['seconds']:g} s each, no pause)")
        a.set_ylabel("env-steps/s")
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        fig.suptitle(_title(res, f"{p['task']} N={p['num_envs']} sustained"), fontsize=8)
    elif kind == "compare":
        fig, a = plt.subplots(figsize=(7.5, 3.2))
        for backend in p["backends"]:
            rows = [r for r in res["rows"] if r["backend"] == backend]
            a.plot(
                [r["workers"] for r in rows],
                [r["env_steps_per_s"] for r in rows],
                "o-",
                label=backend,
            )
        a.set_xlabel(f"workers (threads / processes), {p['envs_per_worker']} env(s) each")
        a.set_xticks(p["workers"])
        a.set_ylabel("env-steps/s (median of rounds)")
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        fig.suptitle(_title(res, f"{p['task']} batched vs Gymnasium"), fontsize=8)
    elif kind == "train":
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
        med = res["summary"]["median"]
        names = list(med)
        xs = range(len(names))
        a.bar(
            [x - 0.2 for x in xs],
            [med[n]["env_steps_per_s"] or 0 for n in names],
            0.4,
            label="env-steps/s",
        )
        a.bar(
            [x + 0.2 for x in xs],
            [med[n]["updates_per_s"] or 0 for n in names],
            0.4,
            label="updates/s",
        )
        a.set_xticks(list(xs))
        a.set_xticklabels(names, fontsize=7)
        a.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, NullFormatter

        a.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.yaxis.set_minor_formatter(NullFormatter())
        a.grid(alpha=0.3, axis="y")
        a.legend(fontsize=7)
        runs = [r for r in res["runs"] if r.get("phases")]
        bottom = [0.0] * len(runs)
        tags = list(runs[0]["phases"]["shares"]) if runs else []
        for tag in tags:
            vals = [r["phases"]["shares"].get(tag, 0.0) for r in runs]
            b.bar(range(len(runs)), vals, bottom=bottom, label=tag.split("/")[-1])
            bottom = [x + v for x, v in zip(bottom, vals)]
        b.set_xticks(range(len(runs)))
        b.set_xticklabels([f"{r['contender']}#{r['round']}" for r in runs], fontsize=7)
        b.set_ylabel("share of learner iteration")
        if runs:
            b.legend(fontsize=6)
        fig.suptitle(_title(res, f"train {p['algo']} on {p['task']}"), fontsize=8)
    elif kind == "sampler":
        fig, a = plt.subplots(figsize=(7.5, 3.2))
        for name in p["contenders"]:
            rows = [r for r in res["rows"] if r["contender"] == name]
            a.plot(
                [r["round"] for r in rows], [r["env_steps_per_s"] for r in rows], "o-", label=name
            )
        a.set_xlabel("round (windows alternate; order reversed every other round)")
        a.set_xticks(range(p["rounds"]))
        a.set_ylabel("env-steps/s")
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        fig.suptitle(
            _title(
                res,
                f"{p['algo']} EnvRunner sampling on {p['task']}, N={p['num_envs']} "
                f"T={p['num_threads']}",
            ),
            fontsize=8,
        )
    else:  # validate_result already refused other kinds
        raise UserError(f"cannot plot a result of kind {kind!r}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def parser():
    p = C.BenchParser(
        prog="raylab bench plot",
        description="Draw a benchmark result (env sweep, sustained, compare, train) to a PNG.",
        formatter_class=C.BenchFormatter,
    )
    p.add_argument("result", metavar="RESULT.json", help="a result written by raylab bench")
    p.add_argument(
        "--bare",
        default=None,
        metavar="BARE.json",
        help="env sweep: a --mode bare sweep to draw as the bare-physics line "
        "(None: the paired bare windows of a --with-bare sweep, if any)",
    )
    p.add_argument("--out", default=None, help="PNG path; None: RESULT with .png")
    return p


def _load(path: str) -> Dict[str, Any]:
    try:
        return C.load_result(path)
    except FileNotFoundError:
        raise UserError(f"raylab bench plot: no such file: {path}") from None
    except (OSError, C.ResultSchemaError) as e:
        raise UserError(f"raylab bench plot: {path}: {e}") from None


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    res = _load(args.result)
    bare = _load(args.bare) if args.bare else None
    if bare is not None and (bare["kind"] != "env_sweep" or bare["params"].get("mode") != "bare"):
        raise UserError(f"raylab bench plot: --bare {args.bare} is not a --mode bare env sweep")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("raylab bench plot needs matplotlib: pip install 'raylab[plot]'") from None
    out = Path(args.out) if args.out else Path(args.result).with_suffix(".png")
    plot_result(res, out, bare)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
