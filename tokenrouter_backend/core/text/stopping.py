"""When generation ends at the token level: max_tokens, end_id and stop token sequences.

Pure functions over the generated token list; the block loop calls ``find_stop`` after
every commit with the index where the new tokens start. Token sequences carry the
exporter's document-end tokens; stop strings are matched on text (``stop_text.py``).
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
    end: int = -1  # generated[:end] holds the ending tokens (-1: same as keep)
    trim: int = 0  # characters at the end of the kept tokens' text to drop (stop strings)

    @property
    def tail_end(self) -> int:
        return self.keep if self.end < 0 else self.end


def find_stop(generated: list[int], start: int, criteria: StopCriteria) -> Stop | None:
    """First stop among generated[start:] (earliest wins), else None."""
    for i in range(start, len(generated)):
        if criteria.end_id is not None and generated[i] == criteria.end_id:
            return Stop(i, "end_id", i + 1)
        for seq in criteria.stop_sequences:
            n = len(seq)
            if n and i + 1 >= n and tuple(generated[i + 1 - n : i + 1]) == seq:
                return Stop(i + 1 - n, "stop_words", i + 1)
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
