"""The names the router compares: generation modes, block schedules, token sources, branch names.

``Mode`` and ``Schedule`` are ``str``-valued enums: a member equals its string, hashes
like it, and ``str()``/``format()``/JSON give the bare value ("verify", never
"Mode.VERIFY"), so wire formats are the same as with plain strings.
"""
from __future__ import annotations

from enum import Enum


class NameEnum(str, Enum):
    """A str-valued enum whose str() and format() are the value itself."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Mode(NameEnum):
    """How a request's blocks are produced (``router_mode``)."""

    HEAVY = "heavy"  # heavy generates every token
    LIGHT = "light"  # light generates every token
    VERIFY = "verify"  # light drafts, heavy verifies (lossless)
    ROUTE = "route"  # light commits what it is sure of, heavy checks the rest


class Schedule(NameEnum):
    """Block-size schedule (``block_schedule``)."""

    FIXED = "fixed"  # every block drafts block_size
    HEURISTIC = "heuristic"  # +2 after a fully accepted block, -1 otherwise


MODES = Mode.values()
SCHEDULES = Schedule.values()



class Source(NameEnum):
    """Where a generated token came from (``RequestStats`` counts each)."""

    HEAVY = "heavy"  # the heavy model's own token
    LIGHT = "light"  # a light draft (unchecked, or verified by the heavy model)
    NGRAM = "ngram"  # a model-free draft (n-gram copy, an earlier answer) the heavy model accepted


# branch names: Branch.name and the metrics' ``branch`` label
HEAVY = Source.HEAVY.value
LIGHT = Source.LIGHT.value
