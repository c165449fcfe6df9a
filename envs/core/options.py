"""Task options: a task's config dataclass (``raylab.envs.tasks``) filled from keyword options
and checked in one place.

Unknown names raise ``TypeError`` listing the valid ones; a field declared with ``choices``
must take one of them; the dataclass's own ``check()`` method (if it has one) raises a one-line
``ValueError`` naming the bad value and the valid range. ``raylab train`` runs the same parse on
the composed ``env.*`` options before Ray starts, so a bad value is refused at once. The
vector-only options (``num_threads``, ``allow_overcommit``, ``autoreset_mode``, ``info_mode``)
are fields too, so one option set serves the batched env and the single (reference) env, which
ignores them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict

from raylab.envs.core.vec_env import check_choice
from raylab.envs.tasks import PLUMBING_FIELDS


def parse_options(config_cls: type, options: Dict[str, Any]):
    """``config_cls`` filled from ``options`` (defaults for the rest), then checked: choices,
    then its ``check()``."""
    names = [f.name for f in fields(config_cls) if f.name not in PLUMBING_FIELDS]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(names))}"
        )
    opts = config_cls(gym_id="", **options)
    for f in fields(config_cls):
        choices = f.metadata.get("choices") or ()
        if choices:
            check_choice(f.name, getattr(opts, f.name), choices)
    if callable(getattr(opts, "check", None)):
        opts.check()
    return opts
