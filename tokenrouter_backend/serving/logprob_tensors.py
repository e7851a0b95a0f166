"""The router's log-probability inputs and outputs (TensorRT-LLM's names where it has them).

Inputs: ``return_log_probs`` (BOOL) asks for the answer tokens' log-probabilities,
``top_log_probs`` (INT32, 0-20; an extension) also for the k most likely tokens at each
position. Outputs, in every router response, covering that response's new tokens (the
tokens past ``PREFIX_LEN`` of its ``OUTPUT_IDS`` window; empty when not asked):
``output_log_probs`` (FP32 [n]), ``cum_log_probs`` (FP32 [1], the answer so far),
``output_log_prob_branches`` (STRING [n]: "heavy" / "light", the model whose number it is;
"" for a token no model scored), ``output_top_ids`` (INT32 [n, k]) and
``output_top_log_probs`` (FP32 [n, k]). The numbers are raw log-probabilities (log-softmax
of the model's logits, before temperature / top-k / top-p), as vLLM's default.
"""
from __future__ import annotations

import math

import numpy as np

from tokenrouter_backend.core.loop.token_logprobs import TokenLogprob
from tokenrouter_backend.core.protocol.branch_protocol import MAX_TOP_LOGPROBS
from tokenrouter_backend.core.protocol.params import InvalidRequest

RETURN_LOG_PROBS = "return_log_probs"
TOP_LOG_PROBS = "top_log_probs"
OUTPUT_LOG_PROBS = "output_log_probs"
CUM_LOG_PROBS = "cum_log_probs"
OUTPUT_BRANCHES = "output_log_prob_branches"
OUTPUT_TOP_IDS = "output_top_ids"
OUTPUT_TOP_LOG_PROBS = "output_top_log_probs"
OUTPUT_NAMES = (OUTPUT_LOG_PROBS, CUM_LOG_PROBS, OUTPUT_BRANCHES, OUTPUT_TOP_IDS, OUTPUT_TOP_LOG_PROBS)


def requested_logprobs(return_log_probs, top_log_probs) -> int:
    """The request's ``GenerationRequest.logprobs``: -1 none, else the top count (0-20)."""
    top = 0 if top_log_probs is None else top_log_probs
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{TOP_LOG_PROBS} must be in [0, {MAX_TOP_LOGPROBS}]; got {top_log_probs}")
    if not return_log_probs:
        if top:
            raise InvalidRequest(f"{TOP_LOG_PROBS} needs {RETURN_LOG_PROBS} true")
        return -1
    return int(top)


class LogprobBuffer:
    """The log-probabilities of emitted tokens not yet in a response, and the running sum."""

    def __init__(self, top: int):
        self.top = max(0, top)
        self.pending: list[TokenLogprob] = []
        self.cumulative = 0.0

    def add(self, entries: list[TokenLogprob]) -> None:
        self.pending.extend(entries)
        self.cumulative += sum(e.logprob for e in entries if math.isfinite(e.logprob))

    def take(self) -> dict[str, np.ndarray]:
        """The outputs of the next response (batch dimension 1); empties the buffer."""
        entries, self.pending = self.pending, []
        n, k = len(entries), self.top
        top_ids = np.zeros((1, n, k), np.int32)
        top_lps = np.zeros((1, n, k), np.float32)
        for i, e in enumerate(entries):
            for j, (token, lp) in enumerate(e.top[:k]):
                top_ids[0, i, j], top_lps[0, i, j] = token, lp
        return {
            OUTPUT_LOG_PROBS: np.asarray([[e.logprob for e in entries]], np.float32).reshape(1, n),
            CUM_LOG_PROBS: np.array([[self.cumulative]], np.float32),
            OUTPUT_BRANCHES: np.asarray([[e.branch.encode() for e in entries]], np.object_).reshape(1, n),
            OUTPUT_TOP_IDS: top_ids,
            OUTPUT_TOP_LOG_PROBS: top_lps,
        }


def empty_outputs() -> dict[str, np.ndarray]:
    """The outputs of a response to a request that asked for none."""
    return LogprobBuffer(0).take()
