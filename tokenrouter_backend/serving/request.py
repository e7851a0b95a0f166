"""Router inputs (Triton tensors) -> ``GenerationRequest``: the field -> tensor map.

Names follow the TensorRT-LLM ensemble (``max_tokens``, ``temperature``, ...); router knobs
are optional inputs named after ``RouterParams`` fields. Limits that need the prompt (the
context length) and the stop strings (``stop_words``, matched on text: they need the
router's decoder) are checked here.
"""
from __future__ import annotations

from tokenrouter_backend.core.block_loop import GenerationRequest
from tokenrouter_backend.core.input_limits import MAX_STOP_IDS, check_count
from tokenrouter_backend.core.names import Mode
from tokenrouter_backend.core.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.stop_text import Decode, StopText, parse_stop_words
from tokenrouter_backend.core.stopping import split_stop_ids
from tokenrouter_backend.serving.tensors import input_array, input_scalar

# request field -> router input tensor name
OPTIONAL_INPUTS = {
    "max_tokens": "max_tokens",
    "stream": "stream",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
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
PROMPT_INPUT = "INPUT_ID"
STOP_INPUT = "STOP_IDS"
END_ID_INPUT = "END_ID"
STOP_WORDS_INPUT = "stop_words"


def parse_request(pb_utils, request, defaults: RouterDefaults, override_mode: Mode | None = None,
                  decode: Decode | None = None) -> GenerationRequest:
    """Build the core request; raises InvalidRequest naming the field.

    ``decode`` (token ids -> text, as postprocessing decodes) is needed for stop_words.
    """
    given = {field: input_scalar(pb_utils, request, name) for field, name in OPTIONAL_INPUTS.items()}
    if override_mode:
        given["router_mode"] = override_mode
    params = defaults.request_params(given)
    prompt = input_array(pb_utils, request, PROMPT_INPUT)
    if prompt is None or prompt.size == 0:
        raise InvalidRequest("text_input must not be empty")
    if prompt.size > defaults.max_input_tokens:
        raise InvalidRequest(f"text_input is {prompt.size} tokens; max_input_tokens allows at most "
                             f"{defaults.max_input_tokens}")
    prompt_ids = tuple(int(t) for t in prompt.reshape(-1))
    if len(prompt_ids) + params.max_tokens > defaults.max_context:
        raise InvalidRequest(
            f"text_input is {len(prompt_ids)} tokens and max_tokens is {params.max_tokens}: "
            f"together they must fit the context of {defaults.max_context} tokens"
        )
    stops = input_array(pb_utils, request, STOP_INPUT)
    check_count(STOP_INPUT, 0 if stops is None else stops.size, MAX_STOP_IDS)
    end_id = input_scalar(pb_utils, request, END_ID_INPUT)
    return GenerationRequest(
        prompt=prompt_ids,
        params=params,
        end_id=None if end_id is None or end_id < 0 else int(end_id),
        stop_sequences=split_stop_ids([] if stops is None else stops.reshape(-1).tolist()),
        stop_text=stop_text(input_array(pb_utils, request, STOP_WORDS_INPUT), decode),
    )


def stop_text(words, decode: Decode | None) -> StopText | None:
    """The ``stop_words`` tensor (strings) -> the request's StopText, None when there are none."""
    strings = parse_stop_words([] if words is None else words.reshape(-1).tolist())
    if not strings:
        return None
    if decode is None:
        raise InvalidRequest("stop_words needs the router's tokenizer (router/1/tokenizer); this repository has none")
    return StopText(strings, decode)
