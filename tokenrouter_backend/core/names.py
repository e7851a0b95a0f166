"""The names the router compares: generation modes, block schedules, branch names.

``Mode`` and ``Schedule`` are ``str``-valued enums: a member equals its string, hashes
like it, and ``str()``/``format()``/JSON give the bare value ("verify", never
"Mode.VERIFY"), so wire formats are the same as with plain strings.
"""
from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    """A str-valued enum whose str() and format() are the value itself."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Mode(_Name):
    """How a request's blocks are produced (``router_mode``)."""

    HEAVY = "heavy"  # heavy generates every token
    LIGHT = "light"  # light generates every token
    VERIFY = "verify"  # light drafts, heavy verifies (lossless)
    ROUTE = "route"  # light commits what it is sure of, heavy checks the rest


class Schedule(_Name):
    """Block-size schedule (``block_schedule``)."""

    FIXED = "fixed"  # every block drafts block_size
    HEURISTIC = "heuristic"  # +2 after a fully accepted block, -1 otherwise


MODES = Mode.values()
SCHEDULES = Schedule.values()

# branch names: Branch.name, RequestStats token sources, the metrics' ``branch`` label
HEAVY = "heavy"
LIGHT = "light"
NGRAM = "ngram"  # token source only: an n-gram draft the heavy model accepted (no branch of its own)
