"""What the block loop notes about the block in progress, for its ``BlockRecord`` (hooks)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence


@dataclass
class BlockNote:
    """What the mode functions learnt about the current block (only kept with hooks)."""

    action: str = ""  # ACTION_*; "" = the mode's own (heavy / light block)
    drafted: Sequence[int] = ()  # light drafts
    confidence: Sequence[float] = ()  # per drafted token
    entropy: Sequence[float] = ()  # per drafted token
    committed_light: int = 0  # drafts that stood
    heavy_agree: Sequence[bool] = ()  # per drafted token with a known heavy verdict
    heavy_prob: Sequence[float] = ()  # heavy prob of those tokens
    ngram_drafted: int = 0  # n-gram drafts the heavy model checked in this block
    ngram_accepted: int = 0  # of those, how many stood


@dataclass(frozen=True)
class BlockStart:
    """Counters when a block began: its BlockRecord reports the differences."""

    generated: int
    heavy_calls: int
    heavy_ms: float
    heavy_forward_ms: float
    light_ms: float
    rolled_back_tokens: int
    started: float  # time.perf_counter()
    block: int  # block size planned for it

    @classmethod
    def of(cls, loop) -> "BlockStart":
        s = loop.stats
        return cls(loop.generated, s.heavy_calls, s.heavy_ms, s.heavy_forward_ms, s.light_ms,
                   s.rolled_back_tokens, time.perf_counter(), loop.block)
