"""Example frames of the panel (docs/terminal.md, ``python -m raylab.terminal``, tests).

They are rendered from ``samples.json`` next to this module: per algorithm, the last two
canonical metric dicts a real ``raylab train`` on microduck_balance handed the panel, with
their iteration, env steps and time, and the run's layout. ``tests/fixtures/
record_terminal_samples.py`` records them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from rich.console import Console

from raylab.metrics import schema as S
from raylab.terminal.render import TerminalPanel
from raylab.terminal.rows import SystemInfo

SAMPLES = Path(__file__).with_name("samples.json")


@lru_cache(maxsize=None)
def _recorded() -> dict:
    return json.loads(SAMPLES.read_text())


def example_samples(algo: str) -> List[Dict[str, float]]:
    """The two recorded iterations of ``algo``'s run: canonical metric dicts."""
    return [dict(s["metrics"]) for s in _recorded()[algo]["samples"]]


def example_panel(algo: str = "appo") -> Tuple[TerminalPanel, float]:
    """A panel fed the recorded samples of ``algo`` half a second apart, and the time to
    render it at."""
    run = _recorded()[algo]
    system = SystemInfo(
        algo=algo,
        task="microduck_balance",
        runners=run["system"]["runners"],
        envs_per_runner=run["system"]["envs_per_runner"],
        learners=run["system"]["learners"],
        gpus_per_learner=0.0,
    )
    panel = TerminalPanel(system)
    t = 100.0
    for i, sample in enumerate(run["samples"]):
        panel.add_sample(
            dict(sample["metrics"]),
            t + 0.5 * i,
            iteration=sample["iteration"],
            env_steps=sample["env_steps"],
            time_total_s=sample["time_total_s"],
        )
    return panel, t + 0.9


def _main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m raylab.terminal", description="print an example frame of the panel"
    )
    parser.add_argument("--algo", choices=S.ALGORITHMS, default="appo")
    parser.add_argument("--width", type=int, default=None, help="columns (default: terminal)")
    args = parser.parse_args(argv)
    console = Console(width=args.width) if args.width else Console()
    panel, now = example_panel(args.algo)
    console.print(panel.render(console.width, now))
    return 0
