"""Copies the light model reads instead of drafting them (route, greedy).

A route block's light drafts are the tokens, top-1 probabilities, entropies and margins the
route gate reads (``drafts.Drafts``). Usually one light step drafts them token by token, one
forward each. When the text so far repeats earlier text (``ngram.lookup``: a docstring
rewritten from the prompt, a name used again), the light model can instead read the copy in
one forward, scoring every position: where its own greedy choice equals the copied token,
that token is exactly the draft its token-by-token drafting would have written, so the
agreeing prefix of the copy and the light model's choice after it are the block's drafts
(``read_copy``), for one forward instead of one per token. The gate then decides on them as
on any light drafts; nothing the heavy model sees changes. Greedy only: a sampled draft is
not the top-1 choice a copy can be compared with.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tokenrouter_backend.core.loop.drafts import Drafts, DraftSource
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult


def read_copy(copy: Sequence[int], result: BranchResult, min_confidence: float) -> tuple[Drafts, int]:
    """The light drafts from the light model's greedy reading of ``copy``, and how many
    copied tokens it agreed with.

    ``result`` scored the last committed token and every copied token (``len(copy) + 1``
    positions): position j holds the light model's choice after the first j copied tokens.
    The drafts are the agreeing prefix and the choice after it; as in token-by-token
    drafting, they end after the first draft below ``min_confidence``."""
    c = len(copy)
    if len(result.tokens) != c + 1:
        raise ValueError(f"a copy of {c} tokens needs {c + 1} scored positions; got {len(result.tokens)}")
    choice = np.asarray(result.tokens, np.int32)
    same = choice[:c] == np.asarray(copy, np.int32)
    agreed = int(np.argmin(same)) if not same.all() else c
    n = agreed + 1
    low = np.nonzero(result.token_probs[:n] < min_confidence)[0]
    if low.size:
        n = int(low[0]) + 1
    margin = result.margin[:n] if len(result.margin) == len(result.tokens) else None
    return Drafts(choice[:n], DraftSource.COPY, result.token_probs[:n], result.entropy[:n], margin), agreed
