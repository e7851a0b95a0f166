"""Triton glue of ``preprocessing`` (text -> token ids) and ``postprocessing`` (ids -> text).

Both load the tokenizer the exporter copied into ``<version dir>/tokenizer`` and are
stateless per execution: postprocessing gets everything it needs from the router's
response (token window, prefix length, final flag, stats, and on the final response the
characters a stop string began in, which it drops). Stop strings go to the router as
text; preprocessing only adds the exporter's document-end tokens (``STOP_IDS``).

Both are public (Triton serves every model of the repository, and an ensemble cannot add a
secret to its steps' requests), so each checks every input's size by name before any
per-token work, and answers any other failure as a named error (docs/security.md,
"Public models").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenrouter_backend.core.protocol import input_limits
from tokenrouter_backend.core.protocol.params import InvalidRequest, config_value, parse_config_value
from tokenrouter_backend.core.text.chat_content import encode_prompt, parse_spans
from tokenrouter_backend.core.text.detokenize import CONTEXT_TOKENS, Detokenizer
from tokenrouter_backend.serving.tensors import (
    bound_bytes_inputs,
    check_scalar,
    config_parameters,
    error_response,
    input_array,
    input_scalar,
)

TOKENIZER_DIR = "tokenizer"
# a config without max_window_tokens (exported before it existed): the longest window the
# default router sends, max_tokens_limit (4096) + the streamed windows' left context
DEFAULT_MAX_WINDOW_TOKENS = 4096 + CONTEXT_TOKENS
DEFAULT_MAX_ROUTING_STATS_BYTES = input_limits.MIB
INT32_MAX = (1 << 31) - 1


def _tokenizer_file(args: dict, parameters: dict[str, str]) -> Path:
    version_dir = Path(args["model_repository"]) / args["model_version"]
    return version_dir / parameters.get("tokenizer_dir", TOKENIZER_DIR) / "tokenizer.json"


def load_tokenizer(args: dict, parameters: dict[str, str]):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(_tokenizer_file(args, parameters)))


def find_tokenizer(args: dict, parameters: dict[str, str]):
    """The model's tokenizer, or None when its version directory has none."""
    return load_tokenizer(args, parameters) if _tokenizer_file(args, parameters).is_file() else None


class PreprocessingModel:
    """text_input (or input_ids), end_id, content_spans, add_special_tokens -> INPUT_ID, STOP_IDS
    (document-end tokens), END_ID.

    ``input_ids`` is a token-id prompt (the OpenAI front's): not tokenized, only checked — at
    most ``max_input_bytes`` ids (a text prompt within that many bytes tokenizes to no more),
    each in the tokenizer's vocabulary — so the router gets it with the same STOP_IDS and
    END_ID as a text prompt, and bounds its length as any prompt's."""

    def __init__(self, pb_utils, args: dict):
        self.pb = pb_utils
        bound_bytes_inputs(pb_utils)
        params = config_parameters(args)
        self.tokenizer = load_tokenizer(args, params)
        self.default_end_id = config_value(params, "end_id", int, -1)  # filled by the exporter
        # document-end tokens besides end_id (exporter-filled); each is a one-token stop sequence
        self.stop_token_ids = [parse_config_value(t, int) for t in params.get("stop_token_ids", "").split(",")
                               if t.strip()]
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        self.literal = None  # built on the first request with content_spans
        self.max_input_bytes = input_limits.max_input_bytes_from_config(
            config_value(params, "max_input_bytes", int, input_limits.DEFAULT_MAX_INPUT_BYTES))

    def _encode(self, text: str, spans, add_special_tokens: bool = True) -> list[int]:
        """text_input's ids; with content_spans (the OpenAI front's chat contents), no special
        token made of content (``core/text/chat_content.py``)."""
        if spans is None:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        from tokenizers import Encoding, Tokenizer

        if self.literal is None:  # the same tokenizer, special-token text split as plain text
            self.literal = Tokenizer.from_str(self.tokenizer.to_str())
            self.literal.encode_special_tokens = True
        return encode_prompt(self.tokenizer, self.literal, text, parse_spans(spans.reshape(-1), len(text)),
                             self.special_ids, Encoding.merge, add_special_tokens)

    def execute(self, requests):
        return [_answer(self.pb, "preprocessing", self._one, r) for r in requests]

    def _given_ids(self, given: np.ndarray) -> list[int]:
        """``input_ids`` checked: its count first, then every id in the vocabulary."""
        input_limits.check_count("input_ids", given.size, self.max_input_bytes)
        if not given.size:
            raise InvalidRequest("input_ids must hold at least one token id")
        input_limits.check_ids("input_ids", given.reshape(-1), self.vocab_size)
        return given.reshape(-1).tolist()

    def _one(self, request):
        pb = self.pb
        values = input_array(pb, request, "text_input")
        given = input_array(pb, request, "input_ids")
        for name in ("end_id", "exclude_input_in_output", "add_special_tokens"):
            check_scalar(input_array(pb, request, name), name)
        if given is not None:
            if values is not None:
                return error_response(pb, "input_ids must not come with text_input (one prompt)")
            ids = self._given_ids(given)
        else:
            # before any decoding or tokenizing
            text = input_limits.text_input([] if values is None else values, self.max_input_bytes)
            if not text.strip():
                return error_response(pb, "text_input must be a non-empty string")
            special = input_scalar(pb, request, "add_special_tokens")
            try:
                ids = self._encode(text, input_array(pb, request, "content_spans"), special is None or bool(special))
            except InvalidRequest as exc:
                return error_response(pb, str(exc))
            if not ids:
                return error_response(pb, "text_input produced no tokens")
        end_id = input_scalar(pb, request, "end_id")
        end_id = self.default_end_id if end_id is None else int(end_id)
        if not -1 <= end_id < self.vocab_size:
            return error_response(pb, f"end_id must be -1 (none) or in [0, {self.vocab_size - 1}]; got {end_id}")
        stop_ids: list[int] = [x for t in self.stop_token_ids for x in (t, -1)]
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("INPUT_ID", np.asarray(ids, dtype=np.int32).reshape(1, -1)),
            pb.Tensor("STOP_IDS", np.asarray(stop_ids or [-1], dtype=np.int32).reshape(1, -1)),
            pb.Tensor("END_ID", np.array([[end_id]], dtype=np.int32)),
        ])


class PostprocessingModel:
    """OUTPUT_IDS window, PREFIX_LEN, IS_FINAL, ROUTING_STATS, STOP_TRIM -> text_output, routing_stats.

    Caps, checked in this order before any token is decoded: TOKENS holds at most
    ``max_window_tokens`` ids; every scalar input one value; ROUTING_STATS_IN at most
    ``max_routing_stats_bytes``; PREFIX_LEN in [0, len(TOKENS)]; STOP_TRIM >= 0; every id in
    [0, vocab_size).
    """

    def __init__(self, pb_utils, args: dict):
        self.pb = pb_utils
        bound_bytes_inputs(pb_utils)
        params = config_parameters(args)
        tokenizer = load_tokenizer(args, params)
        self.detok = Detokenizer(tokenizer)
        self.max_window = config_value(params, "max_window_tokens", int, DEFAULT_MAX_WINDOW_TOKENS)
        self.max_stats_bytes = config_value(params, "max_routing_stats_bytes", int, DEFAULT_MAX_ROUTING_STATS_BYTES)
        # the model's vocabulary (exporter-filled); else the tokenizer's
        self.vocab_size = config_value(params, "vocab_size", int, tokenizer.get_vocab_size(with_added_tokens=True))
        for name, value in (("max_window_tokens", self.max_window), ("max_routing_stats_bytes", self.max_stats_bytes),
                            ("vocab_size", self.vocab_size)):
            if not 1 <= value <= INT32_MAX:
                raise InvalidRequest(f"postprocessing config parameter {name} must be in [1, {INT32_MAX}]; got {value}")

    def execute(self, requests):
        return [_answer(self.pb, "postprocessing", self._one, r) for r in requests]

    def _one(self, request):
        pb = self.pb
        window = input_array(pb, request, "TOKENS")
        window = np.zeros(0, dtype=np.int32) if window is None else window
        input_limits.check_count("TOKENS", window.size, self.max_window)  # before any per-token work
        for name in ("PREFIX_LEN", "IS_FINAL", "ROUTING_STATS_IN", "STOP_TRIM"):
            check_scalar(input_array(pb, request, name), name)
        stats = input_array(pb, request, "ROUTING_STATS_IN")
        stats = b"{}" if stats is None or stats.size == 0 else stats.flat[0]
        size = stats.nbytes if isinstance(stats, input_limits.OversizedElement) else len(stats)
        if size is None or size > self.max_stats_bytes:
            raise InvalidRequest(f"ROUTING_STATS_IN is {size} bytes; at most max_routing_stats_bytes = "
                                 f"{self.max_stats_bytes} allowed")
        stats = (bytes(stats) if isinstance(stats, (bytes, np.bytes_)) else str(stats).encode()) or b"{}"
        window = window.reshape(-1)
        prefix = input_limits.check_range("PREFIX_LEN", int(input_scalar(pb, request, "PREFIX_LEN") or 0),
                                          0, window.size)
        final = bool(input_scalar(pb, request, "IS_FINAL"))
        trim = input_limits.check_range("STOP_TRIM", int(input_scalar(pb, request, "STOP_TRIM") or 0), 0, INT32_MAX)
        input_limits.check_ids("TOKENS", window, self.vocab_size)
        text = self.detok.delta(window.tolist(), prefix, final, trim if final else 0)
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_)),
            pb.Tensor("routing_stats", np.array([[stats]], dtype=np.object_)),
        ])


def _answer(pb, model: str, one, request):
    """One request's response: its result, its InvalidRequest, or any other failure by name
    (never a Python exception out of execute)."""
    try:
        return one(request)
    except InvalidRequest as exc:
        return error_response(pb, str(exc))
    except Exception as exc:  # noqa: BLE001 - one request fails, the model keeps serving
        return error_response(pb, f"{model}: internal error: {type(exc).__name__}: {exc}")
