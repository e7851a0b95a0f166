"""The router's logit-processor inputs -> the request's ``LogitProcessors`` (checked by name).

``presence_penalty`` / ``frequency_penalty`` (FP32, -2 … 2, OpenAI's), ``repetition_penalty``
(FP32, 0.01 … 10, vLLM's; 1 = off), ``min_tokens`` (INT32, 0 … max_tokens: the answer's end
tokens are suppressed until it has this many), ``logit_bias_ids`` / ``logit_bias_values``
(INT32 / FP32 [-1], equal lengths, at most 300 entries, ids in the vocabulary, values
-100 … 100: added to those tokens' logits) and ``ignore_eos`` (BOOL: the end token and the
document-end tokens no longer end the answer; stop strings still do). The processors act on
both branches at every scored position (``core/protocol/logit_processors.py``).
"""
from __future__ import annotations

import math

from tokenrouter_backend.core.protocol.input_limits import check_token_ids
from tokenrouter_backend.core.protocol.logit_processors import (
    BIAS_RANGE,
    MAX_BIAS_ENTRIES,
    PENALTY_RANGE,
    REPETITION_RANGE,
    LogitProcessors,
)
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.serving.router_inputs import BIAS_IDS_INPUT, BIAS_VALUES_INPUT, RouterInputs


def _number(name: str, value, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be in [{low}, {high}]; got {value!r}")
    return float(value)


def request_processors(inputs: RouterInputs, max_tokens: int, vocab: int | None) -> LogitProcessors | None:
    """The request's processors (None when it asks for none); ``vocab`` bounds the bias ids."""
    ids, values = inputs.logit_bias_ids, inputs.logit_bias_values
    if len(ids) != len(values):
        raise InvalidRequest(f"{BIAS_IDS_INPUT} has {len(ids)} entries and {BIAS_VALUES_INPUT} {len(values)}; "
                             "they must pair up")
    if len(ids) > MAX_BIAS_ENTRIES:
        raise InvalidRequest(f"{BIAS_IDS_INPUT} has {len(ids)} entries; at most {MAX_BIAS_ENTRIES} allowed")
    check_token_ids(BIAS_IDS_INPUT, ids, vocab)
    bias = tuple((int(t), _number(BIAS_VALUES_INPUT, float(v), 0.0, *BIAS_RANGE)) for t, v in zip(ids, values))
    min_tokens = inputs.min_tokens if inputs.min_tokens is not None else 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or not 0 <= min_tokens <= max_tokens:
        raise InvalidRequest(f"min_tokens must be in [0, {max_tokens}] (max_tokens); got {min_tokens!r}")
    processors = LogitProcessors(
        presence=_number("presence_penalty", inputs.presence_penalty, 0.0, *PENALTY_RANGE),
        frequency=_number("frequency_penalty", inputs.frequency_penalty, 0.0, *PENALTY_RANGE),
        repetition=_number("repetition_penalty", inputs.repetition_penalty, 1.0, *REPETITION_RANGE),
        bias=tuple((t, v) for t, v in bias if v), min_tokens=min_tokens)
    return processors if processors.active else None
