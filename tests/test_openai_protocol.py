"""The OpenAI front's pure parts: which request fields are accepted or refused by name, the
ensemble knobs a body becomes, server errors sorted into HTTP statuses, response shapes."""
from __future__ import annotations

import json

import pytest

from tokenrouter_backend.openai_front.errors import OpenAIError, from_server
from tokenrouter_backend.openai_front.protocol import ChatBody, CompletionBody
from tokenrouter_backend.openai_front.responses import Endpoint, Reply


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
    (completion, {"n": 3}, "n"),
    (completion, {"frobnicate": 1}, "frobnicate"),
    (completion, {"presence_penalty": 0.5}, "presence_penalty"),
    (completion, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (completion, {"stop": [""]}, "stop"),
    (completion, {"prompt": [1, 2, 3]}, "prompt"),
    (completion, {"prompt": ["a", "b"]}, "prompt"),
    (completion, {"suffix": "}"}, "suffix"),
    (completion, {"best_of": 2}, "best_of"),
    (completion, {"stream_options": {"include_usage": True}}, "stream_options"),
    (chat, {"tools": [{"type": "function"}]}, "tools"),
    (chat, {"logprobs": True}, "logprobs"),
    (chat, {"response_format": {"type": "json_object"}}, "response_format"),
    (chat, {"temperature": 1e-38}, "temperature"),  # 0 < T < MIN_TEMPERATURE: NaN probabilities
    (completion, {"temperature": 0.009}, "temperature"),
])
def test_unsupported_fields_are_refused_by_name(build, fields, param):
    with pytest.raises(OpenAIError) as info:
        build(**fields)
    assert info.value.param == param and info.value.status == 400 and param in info.value.message


def test_harmless_fields_are_accepted():
    assert completion(n=1, presence_penalty=0, user="x", metadata={"a": "b"}, logit_bias={}).knobs() == {}


@pytest.mark.parametrize("message, status, param", [
    ("in ensemble 'tokenrouter', max_tokens must be in [1, 4096]; got 5000", 400, "max_tokens"),
    ("router_mode must be one of heavy, light, verify, route; got 'x'", 400, "router_mode"),
    ("stop_words[0] has 300 characters; at most 256 allowed", 400, "stop"),
    ("text_input is 900 tokens and max_tokens is 200: together they must fit", 400, "prompt"),
    ("router internal error: KeyError: 'x'", 500, None),
    ("in ensemble 'tokenrouter', heavy: forward failed: RuntimeError", 500, None),
    ("unexpected inference input 'foo'", 400, None),
])
def test_server_errors_are_sorted_into_statuses(message, status, param):
    err = from_server(message)
    assert (err.status, err.param) == (status, param)
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}
    assert "in ensemble" not in err.message or status == 500


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
