"""The router's log-probability inputs and outputs (TensorRT-LLM's names where it has them).

Inputs: ``return_log_probs`` (BOOL) asks for the answer tokens' log-probabilities,
``top_log_probs`` (INT32, 0-20; an extension) also for the k most likely tokens at each
position. Outputs, in every router response, covering that response's new tokens (the
tokens past ``PREFIX_LEN`` of its ``OUTPUT_IDS`` window; empty when not asked):
``output_log_probs`` (FP32 [n]), ``cum_log_probs`` (FP32 [1], the answer so far),
``output_log_prob_branches`` (STRING [n]: "heavy" / "light", the model whose number it is;
"" for a token no model scored), ``output_top_ids`` (INT32 [n, k]) and
``output_top_log_probs`` (FP32 [n, k]). The numbers are raw log-probabilities (log-softmax
of the model's logits, before temperature / top-k / top-p), as vLLM's default; a token no
model scored reads ``NO_LOGPROB`` (vLLM's stand-in for minus infinity).

``return_prompt_log_probs`` (BOOL) also scores the prompt: the heavy model's LM head runs
over every prompt position once (only then), and the first response carries
``prompt_log_probs`` (FP32 [p - 1]: each prompt token after the first), ``prompt_top_ids``
and ``prompt_top_log_probs`` (the top k there); later responses carry them empty. With it,
``max_tokens`` 0 is allowed: the prompt is scored and no answer generated.
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
RETURN_PROMPT_LOG_PROBS = "return_prompt_log_probs"
PROMPT_LOG_PROBS = "prompt_log_probs"
PROMPT_TOP_IDS = "prompt_top_ids"
PROMPT_TOP_LOG_PROBS = "prompt_top_log_probs"
OUTPUT_NAMES = (OUTPUT_LOG_PROBS, CUM_LOG_PROBS, OUTPUT_BRANCHES, OUTPUT_TOP_IDS, OUTPUT_TOP_LOG_PROBS,
                PROMPT_LOG_PROBS, PROMPT_TOP_IDS, PROMPT_TOP_LOG_PROBS)
NO_LOGPROB = -9999.0  # a token no model scored (JSON has no NaN or infinity)


def _number(lp: float) -> float:
    return lp if math.isfinite(lp) else NO_LOGPROB


def _top(entries: list[TokenLogprob], k: int) -> tuple[np.ndarray, np.ndarray]:
    """[1, n, k] top ids and log-probabilities (zeros where a token has fewer)."""
    ids, lps = np.zeros((1, len(entries), k), np.int32), np.zeros((1, len(entries), k), np.float32)
    for i, e in enumerate(entries):
        for j, (token, lp) in enumerate(e.top[:k]):
            ids[0, i, j], lps[0, i, j] = token, lp
    return ids, lps


def requested_logprobs(return_log_probs, top_log_probs, return_prompt_log_probs=False) -> int:
    """The request's ``GenerationRequest.logprobs``: -1 none, else the top count (0-20)."""
    top = 0 if top_log_probs is None else top_log_probs
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{TOP_LOG_PROBS} must be in [0, {MAX_TOP_LOGPROBS}]; got {top_log_probs}")
    if not (return_log_probs or return_prompt_log_probs):
        if top:
            raise InvalidRequest(f"{TOP_LOG_PROBS} needs {RETURN_LOG_PROBS} or {RETURN_PROMPT_LOG_PROBS} true")
        return -1
    return int(top)


class LogprobBuffer:
    """The log-probabilities of emitted tokens not yet in a response, and the running sum."""

    def __init__(self, top: int):
        self.top = max(0, top)
        self.pending: list[TokenLogprob] = []
        self.prompt: list[TokenLogprob] = []
        self.cumulative = 0.0

    def add(self, entries: list[TokenLogprob]) -> None:
        self.pending.extend(entries)
        self.cumulative += sum(e.logprob for e in entries if math.isfinite(e.logprob))

    def add_prompt(self, entries: list[TokenLogprob]) -> None:
        """The prompt's log-probabilities (``return_prompt_log_probs``): the next response's."""
        self.prompt = list(entries)

    def take(self) -> dict[str, np.ndarray]:
        """The outputs of the next response (batch dimension 1); empties the buffer."""
        entries, self.pending = self.pending, []
        prompt, self.prompt = self.prompt, []
        n, k = len(entries), self.top
        top_ids, top_lps = _top(entries, k)
        prompt_ids, prompt_lps = _top(prompt, k)
        return {
            OUTPUT_LOG_PROBS: np.asarray([[_number(e.logprob) for e in entries]], np.float32).reshape(1, n),
            CUM_LOG_PROBS: np.array([[self.cumulative]], np.float32),
            OUTPUT_BRANCHES: np.asarray([[e.branch.encode() for e in entries]], np.object_).reshape(1, n),
            OUTPUT_TOP_IDS: top_ids,
            OUTPUT_TOP_LOG_PROBS: top_lps,
            PROMPT_LOG_PROBS: np.asarray([[_number(e.logprob) for e in prompt]], np.float32).reshape(1, len(prompt)),
            PROMPT_TOP_IDS: prompt_ids,
            PROMPT_TOP_LOG_PROBS: prompt_lps,
        }


EMPTY_OUTPUTS = LogprobBuffer(0).take()  # every response to a request that asked for none (read-only arrays)
