"""The router model's inputs: one table of tensor names, read once per Triton request.

``read_router_request`` turns a Triton request into ``RouterInputs``, every input as plain
Python (prompt ids, stop ids, stop words, end id, the optional scalars, the request id);
nothing else reads a router request's tensors. ``serving/request.py`` builds the core
request and admission's ``RequestInfo`` from that one value, and the router model reads
its per-request switches (``learned_router``, ``show_routing``) there. Modelled on the
TensorRT-LLM BLS backend's ``convert_triton_request``: the names in one table, each input
read once. The names are the ``input`` list of ``model_repository/router/config.pbtxt``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from tokenrouter_backend.core.protocol.input_limits import MAX_STOP_IDS, check_count
from tokenrouter_backend.core.protocol.logit_processors import MAX_BIAS_ENTRIES
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.core.text.stop_text import MAX_STOP_WORDS
from tokenrouter_backend.serving.tensors import check_scalar, input_array, input_scalar

PROMPT_INPUT = "INPUT_ID"  # INT32 [-1]: the prompt's token ids (preprocessing)
STOP_IDS_INPUT = "STOP_IDS"  # INT32 [-1]: stop sequences, -1 separated (preprocessing: document ends)
END_ID_INPUT = "END_ID"  # INT32 [1]: the end token; < 0 = none
STOP_WORDS_INPUT = "stop_words"  # STRING [-1]: stop strings, matched on the decoded text
CACHE_SALT_INPUT = "cache_salt"  # STRING [1]: the tenant's caches (read raw: checked by parse_cache_salt)

# RouterParams field -> optional scalar input overriding the config default; names follow
# the TensorRT-LLM ensemble (max_tokens, temperature, ...) and RouterParams' fields
PARAM_INPUTS = {
    "max_tokens": "max_tokens",
    "stream": "stream",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "random_seed": "random_seed",
    "router_mode": "router_mode",
    "block_size": "block_size",
    "block_schedule": "block_schedule",
    "confidence_threshold": "confidence_threshold",
    "entropy_threshold": "entropy_threshold",
    "rollback_threshold": "rollback_threshold",
    "rollback_window": "rollback_window",
    "draft_confidence_threshold": "draft_confidence_threshold",
    "allow_degradation": "allow_degradation",
    "ngram_drafts": "ngram_drafts",
    "light_copies": "light_copies",
    "light_kv_window": "light_kv_window",
    "answer_cache": "answer_cache",
    "router_threshold": "router_threshold",
}
# RouterInputs field -> the other optional scalar inputs
SCALAR_INPUTS = {
    "end_id": END_ID_INPUT,
    "decision_log": "decision_log",  # BOOL: log this request's blocks
    "dynamic_quantile": "dynamic_threshold_quantile",  # FP32: per-request dynamic threshold
    "learned_router": "learned_router",  # BOOL: false = confidence rule though a router is loaded
    "show_routing": "show_routing",  # BOOL: the final routing_stats carry "routing" runs
    "return_log_probs": "return_log_probs",  # BOOL: the answer tokens' log-probabilities (logprob_tensors.py)
    "top_log_probs": "top_log_probs",  # INT32: and the k most likely tokens at each position
    "return_prompt_log_probs": "return_prompt_log_probs",  # BOOL: the prompt's too (max_tokens 0 allowed)
    "presence_penalty": "presence_penalty",  # FP32: logit processors (processor_inputs.py)
    "frequency_penalty": "frequency_penalty",  # FP32
    "repetition_penalty": "repetition_penalty",  # FP32
    "min_tokens": "min_tokens",  # INT32
    "ignore_eos": "ignore_eos",  # BOOL: the end token does not end the answer
}
STOP_TOKEN_IDS_INPUT = "stop_token_ids"  # INT32 [-1]: more tokens that end the answer (vLLM's field)
MAX_STOP_TOKEN_IDS = 64
BIAS_IDS_INPUT = "logit_bias_ids"  # INT32 [-1]: token ids whose logits get ...
BIAS_VALUES_INPUT = "logit_bias_values"  # FP32 [-1]: ... these added (-100 .. 100)
# RouterInputs field -> (list input, most elements); sized before any element is read
LIST_INPUTS = {
    "stop_ids": (STOP_IDS_INPUT, MAX_STOP_IDS),
    "stop_words": (STOP_WORDS_INPUT, MAX_STOP_WORDS),
    "cache_salt": (CACHE_SALT_INPUT, 1),
    "logit_bias_ids": (BIAS_IDS_INPUT, MAX_BIAS_ENTRIES),
    "logit_bias_values": (BIAS_VALUES_INPUT, MAX_BIAS_ENTRIES),
    "stop_token_ids": (STOP_TOKEN_IDS_INPUT, MAX_STOP_TOKEN_IDS),
}
INPUT_NAMES = frozenset({PROMPT_INPUT, *(name for name, _ in LIST_INPUTS.values()), *SCALAR_INPUTS.values(),
                         *PARAM_INPUTS.values()})


@dataclass(frozen=True)
class RouterInputs:
    """One router request's inputs as plain Python; optional scalars are None when absent."""

    request_id: str = ""
    prompt: tuple[int, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)  # RouterParams field -> value, the inputs given
    stop_ids: tuple[int, ...] = ()
    stop_words: tuple = ()  # as sent (UTF-8 bytes or str), checked by parse_stop_words
    end_id: Any = None
    decision_log: Any = None
    dynamic_quantile: Any = None
    learned_router: Any = None
    show_routing: Any = None
    return_log_probs: Any = None
    top_log_probs: Any = None
    return_prompt_log_probs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    min_tokens: Any = None
    ignore_eos: Any = None
    logit_bias_ids: tuple = ()
    logit_bias_values: tuple = ()
    stop_token_ids: tuple = ()
    cache_salt: tuple = ()  # as sent (UTF-8 bytes or str), checked by parse_cache_salt


def _values(array: np.ndarray | None) -> list:
    return [] if array is None else array.reshape(-1).tolist()


def read_router_request(pb_utils, request, max_input_tokens: int | None = None) -> RouterInputs:
    """Every input of one Triton request to the router, read once (scalars unwrapped by
    ``tensors.input_scalar``: bytes decoded, numpy scalars as Python values).

    Every input's size is checked before any of its elements is read: the prompt against
    ``max_input_tokens``, ``STOP_IDS`` and ``stop_words`` against their counts, a scalar
    input holds one value; raises ``InvalidRequest`` naming the input.
    """
    prompt = input_array(pb_utils, request, PROMPT_INPUT)
    if prompt is not None and max_input_tokens is not None and prompt.size > max_input_tokens:
        raise InvalidRequest(f"text_input is {prompt.size} tokens; max_input_tokens allows at most {max_input_tokens}")
    arrays = {name: input_array(pb_utils, request, tensor) for name, (tensor, _) in LIST_INPUTS.items()}
    for name, (tensor, most) in LIST_INPUTS.items():
        check_count(tensor, 0 if arrays[name] is None else arrays[name].size, most)
    for tensor in (*PARAM_INPUTS.values(), *SCALAR_INPUTS.values()):
        check_scalar(input_array(pb_utils, request, tensor), tensor)
    params = {name: input_scalar(pb_utils, request, tensor) for name, tensor in PARAM_INPUTS.items()}
    scalars = {name: input_scalar(pb_utils, request, tensor) for name, tensor in SCALAR_INPUTS.items()}
    request_id = request.request_id() if hasattr(request, "request_id") else ""
    return RouterInputs(
        request_id=str(request_id or ""),
        prompt=() if prompt is None else tuple(prompt.reshape(-1).tolist()),
        params=MappingProxyType({name: value for name, value in params.items() if value is not None}),
        **{name: tuple(_values(array)) for name, array in arrays.items()},
        **scalars,
    )
