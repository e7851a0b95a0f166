"""The OpenAI front's pure parts: which request fields are accepted or refused by name, the
ensemble knobs a body becomes, server errors sorted into HTTP statuses, response shapes."""
from __future__ import annotations

import asyncio
import json

import pytest

from tokenrouter_backend.branches.bls import BlsAnswer, BlsBranch
from tokenrouter_backend.branches.heavy_pool import HeavyPool, PoolConfig
from tokenrouter_backend.branches.remote import RemoteBranch
from tokenrouter_backend.core.loop.block_loop import RequestCancelled
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, KVBudgetFull
from tokenrouter_backend.core.text.stop_text import parse_stop_words
from tokenrouter_backend.openai_front.errors import OpenAIError, from_server
from tokenrouter_backend.openai_front.parsing import Limits, parse
from tokenrouter_backend.openai_front.protocol import (
    INT32_MAX,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    TokenizeChatBody,
    TokenizeCompletionBody,
)
from tokenrouter_backend.openai_front.responses import Endpoint, Reply
from tokenrouter_backend.operations.admission_gate import AdmissionGate, GateConfig
from tokenrouter_backend.server.ports import free_ports
from tokenrouter_backend.serving.router_model import client_failure


def completion(**fields) -> CompletionBody:
    body = CompletionBody.model_validate({"model": "tokenrouter", "prompt": "x", **fields})
    body.check()
    return body


def chat(**fields) -> ChatBody:
    body = ChatBody.model_validate({"model": "tokenrouter", "messages": [{"role": "user", "content": "hi"}],
                                    **fields})
    body.check()
    return body


def test_knobs_map_openai_names_onto_the_ensemble_inputs():
    body = completion(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="\n", router_mode="route",
                      confidence_threshold=0.7, user="u1")
    assert body.knobs() == {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "random_seed": 3,
                            "stop_words": ["\n"], "router_mode": "route", "confidence_threshold": 0.7}
    assert completion().knobs() == {}  # absent fields keep the server's defaults


def test_chat_prefers_max_completion_tokens_and_flattens_text_parts():
    body = chat(max_tokens=5, max_completion_tokens=9)
    assert body.knobs()["max_tokens"] == 9
    parts = ChatBody.model_validate({"model": "tokenrouter", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert parts.template_messages() == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize("build, fields, param", [
    (completion, {"n": 17}, "n"),
    (completion, {"frobnicate": 1}, "frobnicate"),
    (completion, {"logit_bias": {"x": 1}}, "logit_bias"),
    (completion, {"logit_bias": {"5": 101}}, "logit_bias"),
    (completion, {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    (completion, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (completion, {"stop": [""]}, "stop"),
    (completion, {"prompt": []}, "prompt"),
    (completion, {"prompt": [[1], []]}, "prompt"),
    (completion, {"prompt": [1, -1]}, "prompt"),
    (completion, {"suffix": "}"}, "suffix"),
    (completion, {"best_of": 17}, "best_of"),
    (completion, {"stream_options": {"include_usage": True}}, "stream_options"),
    (chat, {"tools": [{"type": "function"}]}, "tools"),
    (chat, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (chat, {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    (completion, {"logprobs": 6}, "logprobs"),
    (completion, {"logprobs": -1}, "logprobs"),
    (completion, {"max_tokens": 0}, "max_tokens"),  # 0 only to score the prompt (echo and logprobs)
    (completion, {"max_tokens": 0, "echo": True}, "max_tokens"),
    (chat, {"response_format": {"type": "json_object"}}, "response_format"),
    (chat, {"temperature": 1e-38}, "temperature"),  # 0 < T < MIN_TEMPERATURE: NaN probabilities
    (completion, {"temperature": 0.009}, "temperature"),
])
def test_unsupported_fields_are_refused_by_name(build, fields, param):
    with pytest.raises(OpenAIError) as info:
        build(**fields)
    assert info.value.param == param and info.value.status == 400 and param in info.value.message


@pytest.mark.parametrize("prompt, prompts", [
    ("a", ["a"]),
    (["a"], ["a"]),
    (["a", "b", "c"], ["a", "b", "c"]),
    ([1, 2, 3], [[1, 2, 3]]),  # one token-id prompt
    ([[1, 2], [3], [4, 5, 6]], [[1, 2], [3], [4, 5, 6]]),
    ([0, INT32_MAX], [[0, INT32_MAX]]),
])
def test_prompt_shapes_as_openai_and_vllm_take_them(prompt, prompts):
    body = completion(prompt=prompt)
    assert body.prompts() == prompts
    assert body.prompt_texts() == [p for p in prompts if isinstance(p, str)]


@pytest.mark.parametrize("prompt, where", [
    ([], "prompt must not be empty"),
    ("", "prompt must not be empty"),
    ([[]], "prompt must not be empty"),
    (["a", ""], "prompt[1] is empty"),
    ([[1], []], "prompt[1] is empty"),
    ([1, -1], "prompt[1] must be a token id"),
    ([1, INT32_MAX + 1], "prompt[1] must be a token id"),
    ([1, True], "prompt[1] must be a token id"),  # JSON true is no token id
    ([1, 2.0], "prompt[1] must be a token id"),
    ([1, "a"], "prompt[1] must be a token id"),
    (["a", 1], "prompt[1] must be a string"),
    ([[1], "a"], "prompt[1] must be a list of token ids"),
    ([[1], [2, None]], "prompt[1][1] must be a token id"),
    ([None], "prompt[0] must be a token id"),
])
def test_malformed_prompts_are_refused_naming_the_prompt(prompt, where):
    with pytest.raises(OpenAIError) as info:
        completion(prompt=prompt)
    assert info.value.param == "prompt" and info.value.status == 400 and where in info.value.message


def test_prompt_count_and_bytes_are_bounded_by_the_limits():
    data = json.dumps({"model": "tokenrouter", "prompt": [[1]] * 3}).encode()
    assert isinstance(parse("completion", data, 1 << 20, max_prompts=3), CompletionBody)
    refused = parse("completion", data, 1 << 20, max_prompts=2)
    assert refused["param"] == "prompt" and refused["code"] == "array_above_max_length"
    assert "3 prompts; at most 2" in refused["message"]
    # the bytes of every text prompt count against max_prompt_bytes
    texts = json.dumps({"model": "tokenrouter", "prompt": ["a" * 60, "b" * 60]}).encode()
    assert isinstance(parse("completion", texts, 120), CompletionBody)
    assert parse("completion", texts, 119)["code"] == "string_above_max_length"
    with pytest.raises(ValueError, match="max_prompts"):
        Limits(max_prompts=0)


@pytest.mark.parametrize("fields, kind, param", [
    ({"prompt": "x", "add_special_tokens": "maybe"}, "tokenize", "add_special_tokens"),
    ({"prompt": "x", "return_token_strs": True}, "tokenize", "return_token_strs"),
    ({"prompt": "x", "frobnicate": 1}, "tokenize", "frobnicate"),
    ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}, "tokenize",
     "continue_final_message"),
    ({"messages": []}, "tokenize", "messages"),
    ({"tokens": [1, -2]}, "detokenize", "tokens"),
    ({"tokens": [1, 2.5]}, "detokenize", "tokens"),
    ({"tokens": "abc"}, "detokenize", "tokens"),
])
def test_tokenizer_bodies_are_refused_by_name(fields, kind, param):
    refused = parse(kind, json.dumps({"model": "tokenrouter", **fields}).encode(), 1 << 20)
    assert isinstance(refused, dict) and refused["param"] == param and refused["status"] == 400, refused


def test_tokenizer_bodies_as_vllm_sends_them():
    plain = parse("tokenize", b'{"prompt": "hi"}', 1 << 20)
    assert isinstance(plain, TokenizeCompletionBody) and plain.model is None and plain.add_special_tokens
    chat_body = parse("tokenize", json.dumps({"model": "tokenrouter", "messages": [{"role": "user", "content": "hi"}],
                                              "add_generation_prompt": False}).encode(), 1 << 20)
    assert isinstance(chat_body, TokenizeChatBody) and not chat_body.add_generation_prompt
    assert chat_body.template_messages() == [{"role": "user", "content": "hi"}]
    assert chat_body.add_special_tokens  # as the chat endpoint tokenizes (vLLM's default is false)
    detok = parse("detokenize", b'{"model": "tokenrouter", "tokens": [5, 0, 7]}', 1 << 20)
    assert isinstance(detok, DetokenizeBody) and detok.tokens == [5, 0, 7]
    assert parse("detokenize", b'{"tokens": []}', 1 << 20).tokens == []


def test_harmless_fields_are_accepted():
    assert completion(n=1, user="x", metadata={"a": "b"}, logit_bias={}).knobs() == {}
    assert completion(presence_penalty=0.5, logit_bias={"7": -100}, min_tokens=2).knobs() == {
        "presence_penalty": 0.5, "logit_bias": {7: -100.0}, "min_tokens": 2}


def _raised(coro_or_call) -> BaseException:
    """The exception a real producer raises (a coroutine is run to its end)."""
    try:
        result = coro_or_call()
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except BaseException as exc:  # noqa: BLE001 - the exception is the point
        return exc
    raise AssertionError("the producer did not fail")


def _busy_gate():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=1, max_queued_requests=0))
        await gate.enter(1)
        await gate.enter(1)  # nobody may queue: refused busy
    return go()


def _bls_error(answer: str):
    """The in-server path: a BlsBranch whose BLS call answered with Triton's error text."""
    async def exec_bls(*_args):
        return BlsAnswer(error=answer)
    return BlsBranch("heavy", "heavy", exec_bls).step(BranchOp(1, 0, (1, 2)))


def _remote_down(port: int):
    """A remote heavy branch on a loopback port nobody listens on (refused at once)."""
    async def go():
        branch = RemoteBranch("heavy", f"127.0.0.1:{port}", model="heavy", timeout_s=5, connect_retries=0)
        try:
            await branch.step(BranchOp(1, 0, (1, 2)))
        finally:
            await branch.close()
    return go()


def _pool_down(ports):
    async def go():
        pool = HeavyPool("heavy", [f"127.0.0.1:{p}" for p in ports], model="heavy", timeout_s=5,
                         config=PoolConfig(connect_retries=0, check_timeout_s=0.5))
        try:
            await pool.step(BranchOp(1, 0, (1, 2)))
        finally:
            await pool.close()
    return go()


def router_message(exc: BaseException, ensemble: bool = False) -> str:
    """The error message the router sends for ``exc`` (the router's own code builds it), as
    the front reads it (inside the ensemble, Triton puts its prefix first)."""
    _, message = client_failure(exc)
    return f"in ensemble 'tokenrouter', {message}" if ensemble else message


PORTS = free_ports(3)
PRODUCERS = {  # name -> (the real exception, status, code, param, Retry-After)
    "invalid field": (lambda: _raised(lambda: parse_stop_words([b"x"] * 17)), 400, None, "stop", None),
    "never fits": (lambda: _raised(lambda: AdmissionGate(GateConfig(max_live_tokens=10)).check(11)), 400, None,
                   "max_tokens", None),
    "busy": (lambda: _raised(_busy_gate), 429, "server_busy", None, "1"),
    "in-server branch": (lambda: _raised(lambda: _bls_error("Stub process 'heavy_0_0' is not healthy.")), 502,
                         "branch_failed", None, None),
    "remote branch down": (lambda: _raised(lambda: _remote_down(PORTS[0])), 502, "branch_failed", None, None),
    "heavy pool down": (lambda: _raised(lambda: _pool_down(PORTS[1:])), 502, "branch_failed", None, None),
    "kv budget": (lambda: KVBudgetFull("heavy branch (heavy): no KV budget for a new session"), 429,
                  "server_busy", None, "1"),
    "cancelled": (lambda: RequestCancelled("request cancelled by the client"), 499, "request_cancelled", None, None),
    "stopping": (lambda: asyncio.CancelledError(), 503, "server_stopping", None, "1"),
    "internal": (lambda: KeyError("x"), 500, "internal_error", None, None),
}


@pytest.mark.parametrize("ensemble", [False, True])
@pytest.mark.parametrize("name", list(PRODUCERS))
def test_router_errors_are_sorted_by_whose_fault_they_are(name, ensemble):
    make, status, code, param, retry = PRODUCERS[name]
    exc = make()
    err = from_server(router_message(exc, ensemble))
    assert (err.status, err.code, err.param, err.headers().get("Retry-After")) == (status, code, param, retry), \
        (name, err)
    assert err.type == ("invalid_request_error" if status == 400 else "server_error")
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}
    assert "in ensemble" not in err.message
    for port in PORTS:  # the branch's own message names its address; the client's never does
        assert str(port) not in err.message and "127.0.0.1" not in err.message
    if name.startswith(("remote", "heavy pool")):
        assert "127.0.0.1" in str(exc) and "the heavy branch is unreachable" in err.message
    if name == "in-server branch":
        assert "the heavy branch failed" in err.message


@pytest.mark.parametrize("message, grpc_status, status, code", [
    ("[request id: 7] Exceeds maximum queue size", "StatusCode.UNAVAILABLE", 429, "server_busy"),  # Triton's text
    ("unexpected inference input 'foo'", "StatusCode.INVALID_ARGUMENT", 400, None),  # a unary call's status
    ("unexpected inference input 'foo'", "", 500, "internal_error"),  # unknown in a stream: the server's fault
    ("failed to connect to all addresses; last error: ipv4:10.0.0.7:8001: refused", "StatusCode.UNAVAILABLE",
     503, "service_unavailable"),
])
def test_other_server_errors(message, grpc_status, status, code):
    err = from_server(message, grpc_status)
    assert (err.status, err.code) == (status, code)
    assert "10.0.0.7" not in err.message and "8001" not in err.message


def test_response_bodies_and_chunks():
    stats = {"prompt_tokens": 4, "generated_tokens": 3, "finish_reason": "stop_words", "mode": "verify"}
    body = Reply(Endpoint.CHAT).body("abc", stats)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "abc", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert body["routing_stats"] == stats
    reply = Reply(Endpoint.COMPLETION)
    last = json.loads(reply.chunk("", {**stats, "finish_reason": "length"})[len("data: "):])
    assert last["object"] == "text_completion" and last["choices"][0]["finish_reason"] == "length"
    assert json.loads(reply.usage_chunk(stats)[len("data: "):])["choices"] == []
    first = json.loads(Reply(Endpoint.CHAT).chunk("a", first=True)[len("data: "):])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}


def test_several_prompts_give_a_choice_each_with_its_stats_and_summed_usage():
    a = {"prompt_tokens": 4, "generated_tokens": 3, "finish_reason": "length"}
    b = {"prompt_tokens": 2, "generated_tokens": 5, "finish_reason": "end_id"}
    reply = Reply(Endpoint.COMPLETION)
    body = reply.batch_body([("x", a), ("y", b)])
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [(0, "x", "length"),
                                                                                       (1, "y", "stop")]
    assert [c["routing_stats"] for c in body["choices"]] == [a, b] and "routing_stats" not in body
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}
    one = reply.batch_body([("x", a)])
    assert one == reply.body("x", a) and one["routing_stats"] == a and "routing_stats" not in one["choices"][0]
    last = json.loads(reply.chunk("", b, index=1)[len("data: "):])
    assert last["choices"][0]["index"] == 1 and last["routing_stats"] == b
    assert json.loads(reply.usage_chunk(a, b)[len("data: "):])["usage"]["total_tokens"] == 14
    openai = pytest.importorskip("openai")
    openai.types.Completion.model_validate(body)


def test_an_error_echoing_a_lone_surrogate_is_still_json():
    # found by tests/test_openai_fuzz.py: a model name "\udfff" came back in the 404's message and
    # the JSON encoder raised, so the client got a plain-text 500
    from starlette.responses import JSONResponse

    from tokenrouter_backend.openai_front.errors import not_found

    err = not_found("The model '\udfff' does not exist", "model_not_found")
    body = JSONResponse(err.body(), status_code=err.status).body
    assert b"\\\\udfff" in body and err.body()["error"]["code"] == "model_not_found"
