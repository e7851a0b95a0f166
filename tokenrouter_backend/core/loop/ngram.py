"""n-gram (prompt-lookup) drafts: continue the text the way it continued before.

Output that copies its input — a function rewritten from the prompt, a quoted document,
JSON echoing the request — is predicted without any model: find the latest earlier place
where the last n tokens (n from ``ngram_max`` down to ``ngram_min``) occurred in the prompt
or the answer so far, and propose the tokens that followed it. verify checks these drafts
with the heavy model exactly as it checks light drafts (lossless; a deterministic proposal
is a one-hot q for speculative sampling, ``acceptance.verify``); route, asked for ``ngram_drafts``, sends them all
to the heavy model (no light model vouched for them). Route's own use is ``light_copies``
(greedy): the light model reads a copy in one forward and its agreeing prefix, plus its own
next token, are that block's light drafts — what its token-by-token drafting would have
written, for one forward instead of one per token; the route gate then treats them as any
light drafts.

``NgramDrafter`` keeps one request's adaptive draft length (grows on full acceptance,
halves on a rejection) and backs off to the light model for a block after an n-gram draft
the heavy model rejected at once, so a misleading match costs at most one heavy forward.
Before any lookup it follows the earlier answer to the same prompt, if the decision cache
has one (``answer_cache.py``).
Pure numpy, no model.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tokenrouter_backend.core.loop.answer_cache import follow
from tokenrouter_backend.core.loop.drafts import DraftSource
from tokenrouter_backend.core.protocol.params import NgramSettings


def lookup(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix
    of ``tokens`` of length ``max_n`` .. ``min_n``; [] when none occurred."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = arr[length - n:]
        # start i of an earlier occurrence: arr[i:i+n] == suffix with a continuation i+n < length
        starts = np.nonzero(arr[: length - n] == suffix[0])[0]
        for j in range(1, n):
            starts = starts[arr[starts + j] == suffix[j]]
        if starts.size:
            begin = int(starts[-1]) + n
            return [int(t) for t in arr[begin:begin + k]]
    return []


class NgramDrafter:
    """A request's model-free drafts: the earlier answer to its prompt while its output
    follows it, else n-gram lookups with an adaptive length and a back-off after a miss."""

    def __init__(self, settings: NgramSettings, prior: Sequence[int] = (), prompt_len: int = 0):
        self.settings = settings
        self.length = min(settings.first_draft, settings.max_draft)
        self.backoff = False  # the last n-gram draft was rejected at once: next block uses light
        self.prior = tuple(prior)  # the earlier answer to this prompt (decision cache)
        self.prompt_len = prompt_len
        self.source = DraftSource.NGRAM  # of the last proposal

    def propose(self, tokens: Sequence[int], room: int, heavy_step: bool = False, light: bool = False) -> list[int]:
        """Drafts for the next block (at most ``room``), or [] to use the light model
        (``heavy_step``: for a planned heavy-only step, where ``heavy_steps`` decides;
        ``light``: a copy for the light model to read, where ``light_copies`` decides)."""
        s = self.settings
        allowed = s.heavy_steps if heavy_step else s.light_copies if light else s.enabled
        if not allowed or room < 1:
            return []
        if self.prior:
            drafts = follow(self.prior, tokens[self.prompt_len:], min(s.max_draft, room))
            if drafts:
                self.source = DraftSource.ANSWER
                return drafts
            self.prior = ()  # the answer went another way: the earlier one is no guide any more
        if self.backoff:
            self.backoff = False
            return []
        self.source = DraftSource.NGRAM
        return lookup(tokens, s.min_n, s.max_n, min(self.length, room))

    def update(self, drafted: int, accepted: int) -> None:
        """Adapt after the check (heavy, or the light model's reading) of ``drafted`` n-gram tokens."""
        if self.source == DraftSource.ANSWER:
            return
        if accepted >= drafted:
            self.length = min(self.length + 4, self.settings.max_draft)
        else:
            self.length = max(2, self.length // 2)
        self.backoff = accepted == 0
