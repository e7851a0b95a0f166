"""Fuzzing the serving endpoints (hypothesis) through a real tritonserver on the tiny pair.

Malformed bodies go to HTTP ``/generate`` and ``/generate_stream`` and malformed tensors to
the gRPC stream: wrong types, huge arrays, unicode edge cases, missing fields, negative /
NaN / huge numbers. Every answer must be a success or an error with a message, within
``ANSWER_TIMEOUT_S`` (never a 5xx, a dropped connection or a hang), and the server must keep
serving. ``TOKENROUTER_FUZZ_EXAMPLES`` sets the cases per test (default 40 in CI; a longer
run: ``TOKENROUTER_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py``).
"""
from __future__ import annotations

import json
import math
import os
import queue

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrouter_backend.client.triton_client import generate_http

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

EXAMPLES = int(os.environ.get("TOKENROUTER_FUZZ_EXAMPLES", "40"))
ANSWER_TIMEOUT_S = 60.0
# Triton's own JSON handling: "parameter key '' was not found in the JSON" is its answer to a
# key holding a NUL character, "attempt to get members for non-object" to a body that is no
# JSON object (both seen in runs of this test)
TRITON_PARSE_ERRORS = ("Unable to parse", "failed to parse", "parameter key", "attempt to get members")
FIELDS = ["text_input", "max_tokens", "stream", "temperature", "top_k", "top_p", "random_seed",
          "stop_words", "end_id", "router_mode", "block_size", "block_schedule",
          "confidence_threshold", "entropy_threshold", "rollback_threshold", "rollback_window",
          "draft_confidence_threshold", "decision_log", "dynamic_threshold_quantile",
          "exclude_input_in_output"]
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

edge_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "\ufeff", "\u202e", "\ud7ff", "💥" * 50, "é" * 300,
                     "\r\n" * 20, "<|endoftext|>", "<|im_end|>", "a" * 5000]),
)
numbers = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, -2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, edge_text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=8), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
huge_list = st.builds(lambda n, v: [v] * n, st.integers(min_value=17, max_value=5000), st.one_of(edge_text, numbers))
# max_tokens: small valid values or invalid ones; valid but long generations only slow the run
max_tokens = st.one_of(st.integers(1, 8), st.integers(max_value=0), st.integers(min_value=5000), values)


@st.composite
def bodies(draw):
    body = {}
    if draw(st.booleans()):
        body["text_input"] = draw(st.one_of(edge_text, values))
    body["max_tokens"] = draw(max_tokens)
    for name in draw(st.lists(st.sampled_from(FIELDS[2:]), max_size=6, unique=True)):
        body[name] = draw(st.one_of(values, huge_list))
    for _ in range(draw(st.integers(0, 2))):
        body[draw(st.text(min_size=1, max_size=12))] = draw(values)
    return body


def _json_bytes(body) -> bytes:
    return json.dumps(body, allow_nan=True).encode()  # NaN/Infinity: invalid JSON on purpose


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


def _missing_text_input(data: bytes) -> bool:
    try:
        body = json.loads(data)
    except ValueError:
        return False
    return isinstance(body, dict) and "text_input" not in body


def _error_of(text: str) -> str:
    """The error message of a JSON answer or of an SSE stream's first event ("data: {...}")."""
    try:
        answer = json.loads(text.removeprefix("data: ").split("\n\n")[0])
    except ValueError:
        return ""
    return answer.get("error", "") if isinstance(answer, dict) else ""


def _check_http(server, path: str, data: bytes) -> None:
    try:
        r = requests.post(f"{server.http_url}{path}", data=data, timeout=ANSWER_TIMEOUT_S,
                          headers={"Content-Type": "application/json"})
    except requests.exceptions.Timeout:
        pytest.fail(f"no answer within {ANSWER_TIMEOUT_S} s to {data[:300]!r}")
    if r.status_code == 200:
        # Triton 2.51's SSE front end answers a request that lacks a required input
        # (text_input) with an empty 200 stream instead of an error event (docs/security.md)
        assert r.text or (path.endswith("generate_stream") and _missing_text_input(data)), \
            f"an empty answer to {data[:300]!r}"
    else:
        error = _error_of(r.text)
        assert error, f"{r.status_code} without an error message for {data[:300]!r}"
        assert "internal error" not in error, f"{error} for {data[:300]!r}"  # our catch-all: a bug
        # Triton's generate front end answers bodies it cannot map to tensors with 500
        # ("Unable to parse ...") before any model runs; every other refusal is a 4xx
        assert r.status_code < 500 or error.startswith(TRITON_PARSE_ERRORS), \
            f"{r.status_code} {error[:300]} for {data[:300]!r}"
    assert server.is_running(), f"the server died on {data[:300]!r}"


@FUZZ
@given(body=bodies())
def test_http_generate_answers_every_body(server, body):
    _check_http(server, "/v2/models/tokenrouter/generate", _json_bytes(body))


@FUZZ
@given(body=bodies(), raw=st.one_of(st.none(), st.binary(max_size=200)))
def test_http_generate_stream_answers_every_body(server, body, raw):
    _check_http(server, "/v2/models/tokenrouter/generate_stream", raw if raw is not None else _json_bytes(body))


GRPC_TYPES = {"BYTES": np.object_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32,
              "FP64": np.float64, "BOOL": bool, "UINT64": np.uint64}


@st.composite
def grpc_tensors(draw):
    tensors = []
    # text_input is always sent (of any type and shape): a stream request without it gets no
    # answer at all from Triton 2.51's gRPC stream front end (docs/security.md)
    names = ["text_input"] + draw(st.lists(st.sampled_from(FIELDS[1:] + ["bogus"]), max_size=4, unique=True))
    for name in names:
        kind = draw(st.sampled_from(sorted(GRPC_TYPES)))
        shape = draw(st.sampled_from([[1, 1], [1, 0], [1, 3], [2, 1], [1], [1, 1, 1], [1, 300]]))
        count = int(np.prod(shape))
        if kind == "BYTES":
            items = draw(st.lists(st.one_of(st.binary(max_size=30), edge_text.map(
                lambda s: s.encode("utf-8", "surrogatepass"))), min_size=count, max_size=count))
            array = np.array(items, dtype=np.object_).reshape(shape)
        elif kind == "BOOL":
            array = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool).reshape(shape)
        elif kind in ("FP32", "FP64"):
            array = np.array(draw(st.lists(st.floats(width=32), min_size=count, max_size=count)),
                             dtype=GRPC_TYPES[kind]).reshape(shape)
        else:
            info = np.iinfo(GRPC_TYPES[kind])
            ints = st.integers(int(info.min), int(info.max))
            drawn = draw(st.lists(ints, min_size=count, max_size=count))
            array = np.array(drawn, dtype=GRPC_TYPES[kind]).reshape(shape)
        if name == "max_tokens" and kind == "INT32" and count == 1 and 8 < int(array.reshape(-1)[0]) < 5000:
            array = np.full(shape, 8, dtype=np.int32)  # keep valid generations short
        tensors.append((name, kind, array))
    return tensors


@FUZZ
@given(tensors=grpc_tensors())
def test_grpc_stream_answers_every_request(server, tensors):
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, kind, array in tensors:
        tensor = grpcclient.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("tokenrouter", inputs)
        while True:
            try:
                result, error = got.get(timeout=ANSWER_TIMEOUT_S)
            except queue.Empty:
                pytest.fail(f"no answer within {ANSWER_TIMEOUT_S} s to {tensors!r}"[:2000])
            if error is not None:
                assert str(error), "an error without a message"
                break
            if result.get_response().parameters.get("triton_final_response", None) is None:
                break  # not decoupled-final-flagged: one response was the whole answer
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert server.is_running()


def test_server_still_serves_after_the_fuzzing(server):
    assert server.is_ready()
    result = generate_http(server.http_url.removeprefix("http://"), "def f():", max_tokens=4)
    assert result.tokens == 4
