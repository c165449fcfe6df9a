"""User-facing errors.

A ``UserError`` is a mistake the user can fix (unknown task, bad override, missing GPU, bad
checkpoint). The CLI prints its message as one line and exits with code 2; no traceback.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class UserError(Exception):
    """A mistake in the user's input; the message is one line naming the value and the choices."""

    exit_code = 2


def choices_hint(value: str, choices: Iterable[str], what: str) -> str:
    """One line: the bad value, the nearest valid one if any, and every valid choice."""
    choices = sorted(set(choices))
    near = difflib.get_close_matches(value, choices, n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    shown = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:12]) + ", ..."
    return f"unknown {what} '{value}'{hint}; valid choices: {shown}"
