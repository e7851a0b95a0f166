"""``RouterInputs`` -> ``GenerationRequest`` (the core request) and ``RequestInfo`` (admission).

Plain Python on the one value ``router_inputs.read_router_request`` read. Limits that need
the prompt (the context length) and the stop strings (``stop_words``, matched on text: they
need the router's decoder) are checked here; the request's optional knobs go through
``RouterDefaults.request_params``.
"""
from __future__ import annotations

from typing import Sequence

from tokenrouter_backend.core.loop.block_loop import GenerationRequest
from tokenrouter_backend.core.protocol.cache_salt import CACHE_SALT, parse_cache_salt
from tokenrouter_backend.core.protocol.input_limits import MAX_STOP_IDS, check_count, check_token_ids
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.text.stop_text import Decode, StopText, parse_stop_words
from tokenrouter_backend.core.text.stopping import split_stop_ids
from tokenrouter_backend.operations.admission import RequestInfo
from tokenrouter_backend.serving.logprob_tensors import requested_logprobs
from tokenrouter_backend.serving.processor_inputs import request_processors
from tokenrouter_backend.serving.router_inputs import STOP_IDS_INPUT, STOP_TOKEN_IDS_INPUT, RouterInputs


def parse_request(inputs: RouterInputs, defaults: RouterDefaults, decode: Decode | None = None,
                  vocab: int | None = None) -> GenerationRequest:
    """Build the core request; raises InvalidRequest naming the field.

    ``decode`` (token ids -> text, as postprocessing decodes) is needed for stop_words;
    ``vocab`` (the vocabulary's size, when known) bounds ``logit_bias_ids``.
    """
    given = dict(inputs.params)
    score_only = given.get("max_tokens") == 0  # the prompt's log-probabilities only
    if score_only:
        if not inputs.return_prompt_log_probs:
            raise InvalidRequest(f"max_tokens must be in [1, {defaults.max_tokens_limit}]; 0 only with "
                                 "return_prompt_log_probs (score the prompt, answer nothing)")
        given["max_tokens"] = 1
    params = defaults.request_params(given)
    prompt = inputs.prompt
    if not prompt:
        raise InvalidRequest("text_input must not be empty")
    if len(prompt) > defaults.max_input_tokens:
        raise InvalidRequest(f"text_input is {len(prompt)} tokens; max_input_tokens allows at most "
                             f"{defaults.max_input_tokens}")
    if len(prompt) + params.max_tokens > defaults.max_context:
        raise InvalidRequest(
            f"text_input is {len(prompt)} tokens and max_tokens is {params.max_tokens}: "
            f"together they must fit the context of {defaults.max_context} tokens"
        )
    check_count(STOP_IDS_INPUT, len(inputs.stop_ids), MAX_STOP_IDS)
    end_id = inputs.end_id
    keep_ends = not inputs.ignore_eos  # ignore_eos: neither the end token nor a document end stops it
    return GenerationRequest(
        prompt=prompt,
        params=params,
        end_id=None if end_id is None or end_id < 0 or not keep_ends else int(end_id),
        stop_sequences=(split_stop_ids(list(inputs.stop_ids)) if keep_ends else ())
        + stop_tokens(inputs.stop_token_ids, vocab),
        processors=request_processors(inputs, params.max_tokens, vocab),
        stop_text=stop_text(inputs.stop_words, decode),
        cache_salt=cache_salt(inputs.cache_salt, defaults.require_cache_salt),
        logprobs=requested_logprobs(inputs.return_log_probs, inputs.top_log_probs, inputs.return_prompt_log_probs),
        prompt_logprobs=bool(inputs.return_prompt_log_probs),
        score_only=score_only,
    )


def stop_tokens(ids: Sequence, vocab: int | None) -> tuple[tuple[int, ...], ...]:
    """The ``stop_token_ids`` input -> one-token stop sequences (ids in the vocabulary)."""
    check_token_ids(STOP_TOKEN_IDS_INPUT, ids, vocab)
    return tuple((int(t),) for t in ids)


def cache_salt(values: Sequence, required: bool = False) -> str:
    """The ``cache_salt`` input (none or one string) -> the request's salt ("" = salt-less)."""
    if len(values) > 1:
        raise InvalidRequest(f"{CACHE_SALT} must hold one string; got {len(values)}")
    salt = parse_cache_salt(values[0]) if values else ""
    if required and not salt:
        raise InvalidRequest(f"{CACHE_SALT} is required by this server (router parameter require_cache_salt)")
    return salt


def stop_text(words: Sequence, decode: Decode | None) -> StopText | None:
    """The ``stop_words`` input (strings) -> the request's StopText, None when there are none."""
    strings = parse_stop_words(list(words))
    if not strings:
        return None
    if decode is None:
        raise InvalidRequest("stop_words needs the router's tokenizer (router/1/tokenizer); this repository has none")
    return StopText(strings, decode)


def request_info(inputs: RouterInputs) -> RequestInfo:
    """What admission needs from the request (its id, prompt, explicit mode, per-request knobs)."""
    log, quantile = inputs.decision_log, inputs.dynamic_quantile
    return RequestInfo(
        request_id=inputs.request_id,
        prompt=inputs.prompt,
        explicit_mode=inputs.params.get("router_mode") not in (None, ""),
        decision_log=None if log is None else bool(log),
        dynamic_quantile=None if quantile is None else float(quantile),
    )
