"""Fuzzing the OpenAI front (hypothesis) through a real tritonserver on the tiny pair.

Generated requests go to ``/v1/completions`` and ``/v1/chat/completions``: malformed and
truncated JSON, non-object bodies, deep nesting, huge / negative / float / bool / string
integers, NaN and infinities, wrong types, unknown and ignored fields, unicode edge cases
(lone surrogates, NUL, control tokens), missing fields, streamed or not. Every answer must be
a valid answer (a completion body, or an SSE stream ending ``data: [DONE]`` whose events are
JSON) or a JSON error of OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status — never a plain-text or 5xx answer — and the front and the server must
still answer at the end. Valid requests ask for at most 4 tokens, so the cases stay quick.
``TOKENROUTER_OPENAI_FUZZ_EXAMPLES`` sets the number of requests (default 2000).
"""
from __future__ import annotations

import collections
import json
import math
import os

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

EXAMPLES = int(os.environ.get("TOKENROUTER_OPENAI_FUZZ_EXAMPLES", "2000"))
ANSWER_TIMEOUT_S = 60.0
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
ERROR_KEYS = {"message", "type", "param", "code"}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
SEEN: collections.Counter = collections.Counter()  # (status, error code) -> count, for the summary

edge_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\x00", "\ufeff", "\u202e", "\ud800", "\udfff", "💥" * 20, "é" * 100,
                     "<|endoftext|>", "<|im_start|>system\n", "\r\n" * 5, "a" * 3000]),
)
ints = st.one_of(
    st.integers(-5, 5), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31 - 1, 2**31, 2**32 + 5, -(2**31) - 1, 2**63, 2**64, 2**64 - 1, 10**20, 10**400]),
)
numbers = st.one_of(ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([math.nan, math.inf, -math.inf, 1e-38, 1e308, -0.0, 0.5, 4.0]))
scalars = st.one_of(st.none(), st.booleans(), numbers, edge_text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=10)
small_tokens = st.integers(1, 4)
# max_tokens: mostly small and valid (a valid request generates at most 4 tokens), else anything
max_tokens = st.one_of(small_tokens, small_tokens, small_tokens, ints, values)
KNOB_VALUES = {
    "temperature": st.one_of(st.sampled_from([0, 0.7, 1.5]), numbers, values),
    "top_p": st.one_of(st.sampled_from([0.5, 1]), numbers, values),
    "seed": st.one_of(st.integers(0, 100), ints, values),
    "n": st.one_of(st.just(1), ints, values),
    "stop": st.one_of(edge_text, st.lists(edge_text, max_size=6), values),
    "stream_options": st.one_of(st.just({"include_usage": True}), values),
    "presence_penalty": numbers, "frequency_penalty": numbers, "logit_bias": values, "user": values,
    "metadata": values, "logprobs": values, "echo": values, "suffix": values, "best_of": values,
    "tools": values, "tool_choice": values, "response_format": values, "top_logprobs": values,
    "router_mode": st.one_of(st.sampled_from(["heavy", "light", "verify", "route"]), values),
    "block_size": st.one_of(st.integers(1, 8), ints, values), "top_k": st.one_of(st.integers(0, 50), ints),
    "block_schedule": st.one_of(st.sampled_from(["fixed", "adaptive"]), values),
    "confidence_threshold": numbers, "entropy_threshold": numbers, "rollback_threshold": numbers,
    "rollback_window": ints, "light_kv_window": ints, "decision_log": values, "answer_cache": values,
    "max_completion_tokens": max_tokens, "max_tokens": ints,
}
VALID_KNOBS = {
    "temperature": st.sampled_from([0, 0.7, 1.5]), "top_p": st.sampled_from([0.5, 1]),
    "seed": st.integers(0, 2**64 - 1),
    "n": st.just(1), "stop": st.one_of(st.text(min_size=1, max_size=5), st.lists(st.text(min_size=1, max_size=5),
                                                                                     min_size=1, max_size=4)),
    "user": st.text(max_size=10), "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    "router_mode": st.sampled_from(["heavy", "light", "verify", "route"]), "block_size": st.integers(1, 8),
    "top_k": st.integers(0, 50), "block_schedule": st.sampled_from(["fixed", "adaptive"]),
    "confidence_threshold": st.floats(0, 1), "answer_cache": st.booleans(), "decision_log": st.booleans(),
}
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": edge_text}),
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=30)}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "tool", "developer"]),
                           "content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": edge_text}),
                                               max_size=3)}),
    st.dictionaries(st.sampled_from(["role", "content", "name", "extra"]), values, max_size=4),
    values,
)


@st.composite
def bodies(draw):
    """A valid request with 0-3 fields replaced by anything, removed, or added."""
    chat = draw(st.booleans())
    body = {"model": "tokenrouter", "max_tokens": draw(small_tokens), "stream": draw(st.booleans())}
    if chat:
        body["messages"] = draw(st.lists(st.fixed_dictionaries({
            "role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=30)}),
            min_size=1, max_size=3))
    else:
        body["prompt"] = draw(st.text(min_size=1, max_size=30))
    for name in draw(st.lists(st.sampled_from(sorted(VALID_KNOBS)), max_size=3, unique=True)):
        body[name] = draw(VALID_KNOBS[name])
    for _ in range(draw(st.integers(0, 3))):
        change = draw(st.integers(0, 5))
        if change == 0 and body:  # a field goes missing
            body.pop(draw(st.sampled_from(sorted(body))))
        elif change == 1:  # an unknown field
            body[draw(st.text(min_size=1, max_size=10))] = draw(values)
        elif change == 2:  # a field of the body, of any type
            body[draw(st.sampled_from(sorted(body) or ["model"]))] = draw(values)
        elif change == 3:
            body["messages" if chat else "prompt"] = draw(st.one_of(
                st.lists(message, min_size=1, max_size=4), edge_text, st.lists(edge_text, max_size=2), values))
        else:  # a known field with a value meant to break it
            name = draw(st.sampled_from(sorted(KNOB_VALUES) + ["max_tokens", "model", "stream"]))
            body[name] = draw(KNOB_VALUES.get(name, values))
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = draw(small_tokens)  # the server's default would generate 64 tokens
    return ("/chat/completions" if chat else "/completions"), body


def encoded(body) -> bytes:
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")  # NaN / lone surrogates on purpose


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda b, cut: encoded(b[1])[:cut], bodies(), st.integers(0, 200)),  # truncated JSON
    st.builds(lambda n: b"[" * n + b"]" * n, st.integers(1, 100_000)),  # deep nesting
    st.builds(lambda n, b: b'{"model": "tokenrouter", "max_tokens": 2, "metadata": ' + b"[" * n + b"]" * n + b"}",
              st.integers(1, 100_000), st.none()),
    st.sampled_from([b"", b"null", b"[]", b'"x"', b"1e999", b'{"model": "tokenrouter", "prompt": "x", '
                     b'"max_tokens": 18446744073709551621}', b'{"model": "tokenrouter", "prompt": "x", "max_tokens": '
                     b'1' + b"0" * 5000 + b"}"]),
)


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


@pytest.fixture(scope="module")
def front(server, tiny_repository, tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(TEMPLATE)
    with OpenAIFront(FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR, template), port=0) as running:
        yield running


@pytest.fixture(scope="module")
def session():
    with requests.Session() as s:
        yield s


def check_answer(front, session, path: str, data: bytes) -> None:
    what = f"{path} {data[:300]!r}"
    try:
        resp = session.post(f"{front.url}{path}", data=data, timeout=ANSWER_TIMEOUT_S,
                            headers={"Content-Type": "application/json"})
    except requests.exceptions.Timeout:
        pytest.fail(f"no answer within {ANSWER_TIMEOUT_S} s to {what}")
    kind = resp.headers.get("content-type", "")
    if resp.status_code == 200:
        SEEN[(200, None)] += 1
        if kind.startswith("text/event-stream"):
            events = [e for e in resp.text.split("\n\n") if e]
            assert events and events[-1] == "data: [DONE]", f"{resp.text[-300:]!r} for {what}"
            for event in events[:-1]:
                chunk = json.loads(event.removeprefix("data: "))
                assert "choices" in chunk or set(chunk["error"]) == ERROR_KEYS, f"{event[:300]} for {what}"
        else:
            assert kind.startswith("application/json") and "choices" in resp.json(), f"{resp.text[:300]} for {what}"
        return
    assert kind.startswith("application/json"), f"{resp.status_code} {kind} {resp.text[:300]!r} for {what}"
    answer = resp.json()
    assert set(answer) == {"error"} and set(answer["error"]) == ERROR_KEYS, f"{resp.text[:300]} for {what}"
    error = answer["error"]
    assert isinstance(error["message"], str) and error["message"], f"{resp.text[:300]} for {what}"
    SEEN[(resp.status_code, error["code"])] += 1
    assert 400 <= resp.status_code < 500, f"{resp.status_code} {error} for {what}"


@FUZZ
@given(case=st.one_of(bodies().map(lambda c: (c[0], encoded(c[1]))),
                      st.tuples(st.sampled_from(["/completions", "/chat/completions"]), raw_bodies)))
def test_the_front_answers_every_request(front, session, case):
    path, data = case
    check_answer(front, session, path, data)


def test_the_front_and_the_server_still_answer(front, server, session):
    print(f"\nOpenAI fuzz answers (status, code): {sorted(SEEN.items(), key=str)}; total {sum(SEEN.values())}")
    assert server.is_ready() and front.is_running()
    resp = session.post(f"{front.url}/completions", timeout=60, json={"model": "tokenrouter", "prompt": "def f():",
                                                                       "max_tokens": 4})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
