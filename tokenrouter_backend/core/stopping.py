"""When generation ends: max_tokens, end_id and stop sequences (token ids).

Pure functions over the generated token list; the block loop calls ``find_stop`` after
every commit with the index where the new tokens start.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopCriteria:
    """Stop rules of one request. Stop sequences and end_id are excluded from the output."""

    max_tokens: int
    end_id: int | None = None
    stop_sequences: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Stop:
    """Where to cut the generated tokens and why."""

    keep: int  # generated tokens that remain
    reason: str  # "end_id" | "stop_words" | "length"


def find_stop(generated: list[int], start: int, criteria: StopCriteria) -> Stop | None:
    """First stop among generated[start:] (earliest wins), else None."""
    for i in range(start, len(generated)):
        if criteria.end_id is not None and generated[i] == criteria.end_id:
            return Stop(i, "end_id")
        for seq in criteria.stop_sequences:
            n = len(seq)
            if n and i + 1 >= n and tuple(generated[i + 1 - n : i + 1]) == seq:
                return Stop(i + 1 - n, "stop_words")
        if i + 1 >= criteria.max_tokens:
            return Stop(criteria.max_tokens, "length")
    return None


def split_stop_ids(flat: list[int]) -> tuple[tuple[int, ...], ...]:
    """Flattened stop sequences separated by -1 (the STOP_IDS tensor) -> tuples."""
    seqs, current = [], []
    for t in flat:
        if t < 0:
            if current:
                seqs.append(tuple(current))
            current = []
        else:
            current.append(int(t))
    if current:
        seqs.append(tuple(current))
    return tuple(seqs)
