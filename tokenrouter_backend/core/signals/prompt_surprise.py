"""The light model's surprise at a prompt: per-token negative log-likelihood, for request-level routing.

``measure`` feeds the prompt's first ``max_tokens`` tokens to the light branch on a session
of its own, in chunks of ``chunk_tokens``, with every position scored (``score_last`` 0:
the branch returns the probability it gave each actual next input token), and releases the
session. ``nll[i]`` is -log p(prompt[i] | prompt[:i]); the first token, the first token of
each later chunk (its probability belongs to the previous chunk's last position, which the
contract scores as the model's own choice) and every token past ``max_tokens`` stay NaN.

Cost: one light prefill of those tokens with the vocabulary-sized LM head at every
position (``chunk_tokens`` x vocabulary floats of logits per forward). A fully scored
prefill does not read the prefix cache, but its full blocks are left in it (under the
request's cache salt), so the request's own light prefill afterwards reuses them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp

_TINY = 1e-12


@dataclass(frozen=True)
class PromptSurprise:
    nll: np.ndarray  # float64 [len(prompt)]: -log p(token i | tokens before it); NaN = not scored
    elapsed_ms: float = 0.0  # time the light branch took

    @property
    def scored(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.nll)))

    @property
    def mean(self) -> float:
        """Mean NLL (nats) over the scored tokens; NaN when none was."""
        return float(np.nanmean(self.nll)) if self.scored else float("nan")


async def measure(light: Branch, prompt: Sequence[int], session_id: int, max_tokens: int,
                  chunk_tokens: int, cache_salt: str = "") -> PromptSurprise:
    """Score the prompt's first ``max_tokens`` tokens on the light branch (see the module docstring)."""
    started = time.perf_counter()
    nll = np.full(len(prompt), np.nan)
    n = min(len(prompt), max_tokens)
    kept = 0
    try:
        for start in range(0, n, max(1, chunk_tokens)):
            chunk = tuple(int(t) for t in prompt[start:min(n, start + chunk_tokens)])
            res = await light.step(BranchOp(session_id=session_id, keep_len=kept, input_ids=chunk, score_last=0,
                                            cache_salt=cache_salt if kept == 0 else ""))
            probs = np.asarray(res.input_probs, np.float64)[: len(chunk) - 1]
            nll[start + 1:start + 1 + len(probs)] = -np.log(np.clip(probs, _TINY, 1.0))
            kept = res.session_len
    finally:
        await light.release(session_id)
    return PromptSurprise(nll, (time.perf_counter() - started) * 1e3)
