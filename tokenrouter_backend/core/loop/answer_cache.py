"""Decision cache: what was decided once for a prompt, offered again as drafts.

A request whose prompt (token ids) is exactly one answered before starts with that earlier
answer as its draft source: while its own output still follows the earlier one, the next
tokens of the earlier answer are drafted — no light forward, no lookup — and checked by
the heavy model like n-gram drafts (verify: lossless, whatever the sampling settings;
route: sent to the heavy model). Retries, repeated questions and fixed prompts (health
checks, templated calls) then cost about one heavy forward per ``ngram_max_draft`` tokens.
The cache holds the latest answers of the most recently used prompts, bounded in entries
and in tokens per answer. Entries are keyed by the request's cache salt as well
(``core/protocol/cache_salt.py``): a request never follows, nor learns of, an answer given
under another salt. Pure Python; one instance per router, used from its event loop.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.protocol.cache_salt import salt_key

DEFAULT_ENTRIES = 256  # answer_cache_entries default (0 = off)
MAX_ANSWER_TOKENS = 4096  # longest answer kept


def prompt_key(prompt: Sequence[int], salt: str = "") -> bytes:
    """The entry's name: the prompt's ids hashed with the salt's key as blake2b's key."""
    return hashlib.blake2b(np.asarray(prompt, dtype="<i4").tobytes(), digest_size=16, key=salt_key(salt)).digest()


class AnswerCache:
    """Earlier answers by prompt, least recently used dropped first."""

    def __init__(self, entries: int = DEFAULT_ENTRIES):
        if entries < 0:
            raise ValueError(f"answer_cache_entries must be >= 0; got {entries}")
        self.entries = entries
        self._answers: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, prompt: Sequence[int], salt: str = "") -> tuple[int, ...]:
        """The latest answer to exactly this prompt under this salt (() when none)."""
        if not self.entries:
            return ()
        self.lookups += 1
        key = prompt_key(prompt, salt)
        answer = self._answers.get(key)
        if answer is None:
            return ()
        self.hits += 1
        self._answers.move_to_end(key)
        return answer

    def put(self, prompt: Sequence[int], answer: Sequence[int], salt: str = "") -> None:
        if not self.entries or not answer:
            return
        key = prompt_key(prompt, salt)
        self._answers[key] = tuple(int(t) for t in answer[:MAX_ANSWER_TOKENS])
        self._answers.move_to_end(key)
        while len(self._answers) > self.entries:
            self._answers.popitem(last=False)


def follow(prior: Sequence[int], generated: Sequence[int], k: int) -> list[int]:
    """The next ``k`` tokens of ``prior`` while ``generated`` is still its prefix, else []."""
    n = len(generated)
    if k < 1 or n >= len(prior) or list(prior[:n]) != list(generated):
        return []
    return [int(t) for t in prior[n:n + k]]
