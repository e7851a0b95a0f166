"""Terminal colours for ``tokenrouter generate --show-routing``: each run of tokens by origin.

Runs come from the final ``routing_stats`` of a request sent with ``show_routing``:
``[[kind, text], ...]`` with kinds of ``core/routing_trace.Kind``.
"""
from __future__ import annotations

from typing import Sequence

from tokenrouter_backend.core.loop.routing_trace import LABELS, Kind

RESET = "\x1b[0m"
ANSI = {  # foreground colours, readable on dark and light terminals
    Kind.LIGHT_UNCHECKED: "\x1b[32m",  # green
    Kind.LIGHT_VERIFIED: "\x1b[36m",  # cyan
    Kind.HEAVY: "\x1b[33m",  # yellow
    Kind.ROLLED_BACK: "\x1b[1;31m",  # bold red
    Kind.COPIED: "\x1b[35m",  # magenta
}


def coloured(runs: Sequence[Sequence[str]], colour: bool = True) -> str:
    """The answer with each run in its kind's colour (``colour=False``: [kind:text] marks)."""
    out = []
    for kind_code, text in runs:
        kind = Kind(kind_code)
        out.append(f"{ANSI[kind]}{text}{RESET}" if colour else f"[{kind.value}:{text}]")
    return "".join(out)


def legend(runs: Sequence[Sequence[str]], colour: bool = True) -> str:
    """One line: each kind's colour, label and share of the answer's characters."""
    total = sum(len(t) for _, t in runs) or 1
    parts = []
    for kind in Kind:
        chars = sum(len(t) for k, t in runs if k == kind.value)
        label = f"{LABELS[kind]} {chars / total:.0%}"
        parts.append(f"{ANSI[kind]}■ {label}{RESET}" if colour else f"{kind.value}={label}")
    return "  ".join(parts)
