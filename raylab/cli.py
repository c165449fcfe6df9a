"""The ``raylab`` command: train, eval, plot, soak, trace, tune, bench, metrics.

Flags are parsed by argparse; configuration overrides (``algo.lr=3e-4``) are composed by
``raylab.config`` with OmegaConf. A user mistake ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from raylab.errors import UserError

PROG = "raylab"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exits with 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message}")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _config_epilog(algo: str = "appo", task: str = "microduck_balance") -> str:
    from raylab.config import compose, describe

    cfg = compose(algo, task)
    return (
        "config overrides (KEY=VALUE, Hydra-style dotted keys; defaults shown for "
        f"--algo {algo} --task {task}; other algos and tasks add or change keys, "
        "see --print-config):\n" + describe(cfg)
    )


def _add_compose_args(p: argparse.ArgumentParser) -> None:
    from raylab.config import ALGOS, SIMS
    from raylab.envs.tasks import TASKS

    p.add_argument("--algo", default="appo", help=f"algorithm: {', '.join(ALGOS)}")
    p.add_argument(
        "--task",
        default="microduck_balance",
        help=f"task: {', '.join(TASKS)}, or any Gymnasium id (e.g. Pendulum-v1)",
    )
    # One physics backend (MuJoCo): recorded in run_config.json as `sim`, not a choice to make.
    p.set_defaults(sim=SIMS[0])
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. algo.lr=3e-4"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="raylab: train robot control policies in MuJoCo on Ray (PPO, APPO, SAC).",
        formatter_class=_Formatter,
    )
    from raylab import __version__

    parser.add_argument("--version", action="version", version=f"raylab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    # train
    p = sub.add_parser(
        "train",
        help="train a policy (one-trial Ray Tune experiment)",
        description="Train a policy with RLlib on Ray. Starts Ray in-process unless "
        "resources.ray_address or RAY_ADDRESS names a cluster. Writes a run directory with "
        "TensorBoard (or W&B) logs, run_config.json, run_summary.json and checkpoints.",
        formatter_class=_Formatter,
        epilog=_config_epilog(),
    )
    _add_compose_args(p)
    p.add_argument(
        "--print-config", action="store_true", help="print the fully composed config and exit"
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue a run from its last checkpoint (same config, counters and run "
        "directory). Loading a checkpoint unpickles code: RUN_DIR must be a run directory "
        "raylab wrote, or pass --trust-checkpoint",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load a checkpoint from a directory raylab did not write (it runs code it holds)",
    )
    p.set_defaults(func=_cmd_train)

    # eval
    p = sub.add_parser(
        "eval",
        help="evaluate a trained policy",
        description="Run a trained policy deterministically on fixed-seed episodes; print mean "
        "return, survival and episode length; write eval.json into the run directory.",
        formatter_class=_Formatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by raylab train")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint path, or best (the best evaluation during training); default the latest",
    )
    p.add_argument(
        "--episodes", type=int, default=100, help="episodes to run (episode k: seed + k)"
    )
    p.add_argument("--seed", type=int, default=1000, help="seed of the first episode")
    p.add_argument("--video", action="store_true", help="render play_video.mp4 (offscreen)")
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="loading a checkpoint unpickles code: without this flag only a checkpoint inside a "
        "run directory raylab wrote is loaded",
    )
    p.set_defaults(func=_cmd_eval)

    # plot
    p = sub.add_parser(
        "plot",
        help="learning curves of one or more runs as a PNG",
        description="Draw Train/mean_reward and Eval/mean_reward against env steps (several "
        "runs of one config: mean and +/- 1 sd), with the task's hold-pose and random-action "
        "baselines as horizontal lines.",
        formatter_class=_Formatter,
    )
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories")
    p.add_argument(
        "--out",
        default=None,
        help="PNG path (default: RUN_DIR/learning_curve.png for one run, else "
        "./learning_curve.png)",
    )
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the baseline lines (they take up to a minute the first time)",
    )
    p.set_defaults(func=_cmd_plot)

    # soak
    p = sub.add_parser(
        "soak",
        help="a long training run watched for stalls, leaks and failures (writes soak.json)",
        description="Train (the options of raylab train) and watch the run: throughput per "
        "window and its trend, each actor's memory, object store use, actor restarts and "
        "progress ticks. Stops the run on a stall (timeout/stale_tick) or a memory leak "
        "(resource_leak) and writes <run_dir>/soak.json (artifact 0.3.0) with the failure "
        "class, or null on a pass. Exit code 0 only on a pass.",
        formatter_class=_Formatter,
    )
    _add_compose_args(p)
    p.add_argument("--duration", default="30m", help="training time: 90s, 30m, 2h")
    p.add_argument("--window", default="60s", help="length of one monitoring window")
    p.add_argument(
        "--stale",
        default=None,
        help="no progress for this long fails the soak (default: 3 windows, at least 120s)",
    )
    p.add_argument(
        "--leak-mb-per-min",
        type=float,
        default=10.0,
        help="an actor whose memory grows faster than this after the first window is a leak",
    )
    p.add_argument(
        "--warmup",
        default="30s",
        help="training time before memory counts towards a leak (allocator pools, first batches)",
    )
    p.add_argument(
        "--leak-span",
        default="60s",
        help="the shortest stretch of windows (after warm-up) a leak is judged on",
    )
    p.add_argument(
        "--check",
        metavar="SOAK_JSON",
        default=None,
        help="only validate an existing soak.json (fail-closed) and print its verdict",
    )
    p.set_defaults(func=_cmd_soak)

    # trace
    p = sub.add_parser(
        "trace",
        help="merge a traced run's per-process trace files into one Perfetto timeline",
        description="Merge the trace-event files a run wrote with training.trace_enabled=true "
        "(one per process) into <trace dir>/merged.json for ui.perfetto.dev or "
        "chrome://tracing, and print where the time went per process and track.",
        formatter_class=_Formatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of a traced run")
    p.set_defaults(func=_cmd_trace)

    # tune
    p = sub.add_parser(
        "tune",
        help="run a Ray Tune hyperparameter sweep from a YAML file",
        description="Run a hyperparameter sweep described by a YAML file in tune_configs/.",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        default=None,
        help="sweep YAML (see tune_configs/); omit with --resume",
    )
    p.add_argument(
        "--resume",
        metavar="SWEEP_DIR",
        default=None,
        help="resume an interrupted sweep from its directory",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="base config overrides for every trial"
    )
    p.set_defaults(func=_cmd_tune)

    # bench
    p = sub.add_parser(
        "bench",
        help="benchmarks (env, compare, train, plot, baselines)",
        description="Throughput benchmarks with drift guards, and the fixed-policy baselines; "
        "results are saved as JSON.",
        formatter_class=_Formatter,
    )
    p.add_argument("what", nargs="?", default=None, help="env | compare | train | plot | baselines")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark")
    p.set_defaults(func=_cmd_bench)

    # metrics
    p = sub.add_parser(
        "metrics",
        help="read run metrics (extract) and the canonical schema (docs)",
        description="Read a run's canonical metrics into a table or CSV; print the schema.",
        formatter_class=_Formatter,
    )
    p.add_argument("what", nargs="?", default=None, help="extract | docs")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options of the subcommand")
    p.set_defaults(func=_cmd_metrics)
    return parser


def _cmd_train(args) -> int:
    from raylab.config import compose, to_yaml

    if args.print_config:
        if args.resume:
            from pathlib import Path

            from raylab.train import load_run_config

            cfg = load_run_config(Path(args.resume))
        else:
            cfg = compose(args.algo, args.task, args.sim, args.overrides)
        print(to_yaml(cfg), end="")
        return 0
    if args.resume and args.overrides:
        raise UserError("--resume continues a run with its own config; drop the overrides")
    from raylab.train import train

    return train(
        args.algo,
        args.task,
        args.sim,
        args.overrides,
        resume=args.resume,
        trust_checkpoint=args.trust_checkpoint,
    )


def _cmd_eval(args) -> int:
    from raylab.evaluate import evaluate

    return evaluate(
        args.run_dir,
        args.checkpoint,
        args.episodes,
        args.seed,
        args.video,
        trust_checkpoint=args.trust_checkpoint,
    )


def _cmd_plot(args) -> int:
    from raylab.plot import plot_runs

    plot_runs(args.run_dirs, args.out, baselines=not args.no_baselines)
    return 0


def _cmd_soak(args) -> int:
    from raylab.soak import read_soak, run_soak

    if args.check:
        d = read_soak(args.check)
        verdict = "passed" if d["passed"] else f"failed: {d['failure_classification']}"
        print(f"raylab: {args.check}: valid soak artifact {d['schema_version']}; {verdict}")
        return 0
    return run_soak(
        args.algo,
        args.task,
        args.sim,
        args.overrides,
        args.duration,
        args.window,
        args.stale,
        args.leak_mb_per_min,
        warmup=args.warmup,
        leak_span=args.leak_span,
    )


def _cmd_trace(args) -> int:
    from raylab.metrics.trace_merge import main as trace_main

    return trace_main(args.run_dir)


def _cmd_tune(args) -> int:
    from raylab.sweep import run_sweep

    return run_sweep(args.file, args.overrides, resume=args.resume)


def _cmd_bench(args) -> int:
    # Each benchmark has its own parser (`raylab bench env --help`); they live in the
    # raylab.bench package and are imported only when used.
    choices = {
        "env": ("raylab.bench.env", "main_env"),
        "compare": ("raylab.bench.env", "main_compare"),
        "train": ("raylab.bench.train", "main"),
        "plot": ("raylab.bench.plot", "main"),
        "baselines": ("raylab.bench.baselines", "main"),
    }
    if args.what is None:
        raise UserError(
            f"raylab bench: say which benchmark: {' | '.join(choices)} "
            "(`raylab bench env --help` lists its options)"
        )
    if args.what not in choices:
        from raylab.errors import choices_hint

        raise UserError("raylab bench: " + choices_hint(args.what, choices, "benchmark"))
    import importlib

    module, func = choices[args.what]
    return getattr(importlib.import_module(module), func)(list(args.rest))


def _cmd_metrics(args) -> int:
    from raylab.metrics.cli import main as metrics_main

    # A UserError (bad subcommand, run that fails the schema) reaches main() as one line.
    return metrics_main(([args.what] if args.what else []) + list(args.rest))


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as e:
        msg = str(e)
        if not msg.startswith(PROG):
            msg = f"{PROG}: error: {msg}"
        print(msg, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


def entry() -> None:
    """The ``raylab`` console script: :func:`main`, then the end of the process.

    Everything Python runs at a normal exit still runs, in its order: the threads that are not
    daemons are joined, then the ``atexit`` handlers (Ray's shutdown of the local cluster,
    logging's flush, W&B's). What is skipped is the interpreter's own teardown after them, the
    native threads and destructors of torch, MuJoCo and Ray's core worker: about a second of a
    stopped run's exit here (2.4 s from the end of ``main`` to the exit, 1.0 s of it after the
    last ``atexit`` handler), the part of it that grew most when the machine was loaded, and
    the place of a segmentation fault seen once after a complete test session (tests/conftest.py
    ends its sessions the same way)."""
    import atexit
    import os
    import threading

    from raylab.quiet import flush_std_streams, whole_lines

    whole_lines()  # Ray's log thread and raylab print to the same streams
    code = main()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    flush_std_streams()
    os._exit(code)


if __name__ == "__main__":
    entry()
