"""Prompts as token ids and lists in ``/v1/completions``, and vLLM's ``/tokenize`` /
``/detokenize``, through the front against a real tritonserver on the tiny pair (the
fixtures of ``test_openai_front.py``). Expected answers come from the same server in the
same test: a token-id prompt answers as its text, a list of prompts as each one alone."""
from __future__ import annotations

import json

import pytest
import requests
from test_openai_front import MESSAGES, PROMPT, client, front, server, template_file  # noqa: F401 - fixtures

pytestmark = pytest.mark.triton

openai = pytest.importorskip("openai")

PROMPTS = [PROMPT, "def add(a, b):\n    return", "class Stack:\n    def push(self, item):"]
GREEDY = {"model": "tokenrouter", "max_tokens": 10, "temperature": 0}


def post(front, path: str, body: dict) -> requests.Response:  # noqa: F811 - front is the fixture's value
    base = front.url[: -len("/v1")] if path in ("/tokenize", "/detokenize") else front.url
    return requests.post(base + path, json=body, timeout=120)


def complete(front, **fields) -> dict:  # noqa: F811
    resp = post(front, "/completions", {**GREEDY, **fields})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    openai.types.Completion.model_validate(body)  # the raw JSON is what the SDK's types describe
    return body


def stream(front, **fields) -> tuple[dict[int, str], list[dict]]:  # noqa: F811
    resp = post(front, "/completions", {**GREEDY, **fields, "stream": True})
    assert resp.status_code == 200, resp.text
    events = [e[len("data: "):] for e in resp.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks:  # (the SDK's types have no chunk model: a chunk's finish_reason is null until its last)
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts, chunks


def tokenize(front, **fields) -> dict:  # noqa: F811
    resp = post(front, "/tokenize", {"model": "tokenrouter", **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def refusal(resp: requests.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_tokenize_counts_what_generation_sees_and_detokenize_round_trips(front):  # noqa: F811
    tokens = tokenize(front, prompt=PROMPT)
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > tokens["count"]
    assert complete(front, prompt=PROMPT)["usage"]["prompt_tokens"] == tokens["count"]
    back = post(front, "/detokenize", {"model": "tokenrouter", "tokens": tokens["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": PROMPT}
    assert post(front, "/detokenize", {"tokens": []}).json() == {"prompt": ""}  # model may be left out (vLLM)
    plain = tokenize(front, prompt=PROMPT, add_special_tokens=False)
    assert plain["count"] <= tokens["count"] and plain["max_model_len"] == tokens["max_model_len"]


def test_tokenize_chat_counts_what_the_chat_endpoint_sees(front):  # noqa: F811
    counted = tokenize(front, messages=MESSAGES)
    resp = post(front, "/chat/completions", {**GREEDY, "messages": MESSAGES})
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] == counted["count"]
    without = tokenize(front, messages=MESSAGES, add_generation_prompt=False)
    assert without["count"] < counted["count"]  # the template's "<assistant>" opening is left out
    assert without["tokens"] == counted["tokens"][: without["count"]]


def test_a_token_id_prompt_answers_as_its_text(front):  # noqa: F811
    ids = tokenize(front, prompt=PROMPT)["tokens"]
    as_text = complete(front, prompt=PROMPT)
    as_ids = complete(front, prompt=ids)
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"] != ""
    assert as_ids["usage"] == as_text["usage"]
    assert as_ids["choices"][0]["finish_reason"] == as_text["choices"][0]["finish_reason"]
    assert stream(front, prompt=ids)[0] == {0: as_text["choices"][0]["text"]}
    echoed = complete(front, prompt=ids, echo=True)  # the prompt's text, decoded by the server
    assert echoed["choices"][0]["text"] == PROMPT + as_text["choices"][0]["text"]


@pytest.mark.parametrize("as_ids", [False, True])
def test_several_prompts_answer_each_as_alone_in_order(front, as_ids):  # noqa: F811
    alone = [complete(front, prompt=p) for p in PROMPTS]
    prompts = [tokenize(front, prompt=p)["tokens"] for p in PROMPTS] if as_ids else PROMPTS
    batch = complete(front, prompt=prompts)
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    assert [c["text"] for c in batch["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert [c["finish_reason"] for c in batch["choices"]] == [a["choices"][0]["finish_reason"] for a in alone]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert batch["usage"][key] == sum(a["usage"][key] for a in alone)
    stats = [c["routing_stats"] for c in batch["choices"]]  # per choice, none on the body
    assert "routing_stats" not in batch
    assert [s["generated_tokens"] for s in stats] == [a["usage"]["completion_tokens"] for a in alone]

    texts, chunks = stream(front, prompt=prompts, stream_options={"include_usage": True})
    assert texts == {i: a["choices"][0]["text"] for i, a in enumerate(alone)}
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in finals) == [0, 1, 2]  # one final chunk per choice
    for final in finals:
        index = final["choices"][0]["index"]
        assert final["choices"][0]["finish_reason"] == batch["choices"][index]["finish_reason"]
        assert final["routing_stats"]["generated_tokens"] == stats[index]["generated_tokens"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == batch["usage"]
    echoed = complete(front, prompt=prompts, echo=True)
    assert [c["text"] for c in echoed["choices"]] == [p + a["choices"][0]["text"] for p, a in zip(PROMPTS, alone)]


def test_bad_prompts_are_refused_naming_the_prompt(front):  # noqa: F811
    ids = tokenize(front, prompt=PROMPT)["tokens"]
    for stream_it in (False, True):
        error = refusal(post(front, "/completions", {**GREEDY, "prompt": ids + [10 ** 9], "stream": stream_it}))
        assert error["param"] == "prompt" and str(10 ** 9) in error["message"]  # outside the vocabulary
    error = refusal(post(front, "/completions", {**GREEDY, "prompt": [ids, [10 ** 9]]}))
    assert error["param"] == "prompt" and error["message"].startswith("prompt 1: ")  # which prompt failed
    for empty in ([], [[]], "", [ids, []]):
        assert refusal(post(front, "/completions", {**GREEDY, "prompt": empty}))["param"] == "prompt"
    error = refusal(post(front, "/completions", {**GREEDY, "prompt": [ids] * 65}))
    assert error["param"] == "prompt" and error["code"] == "array_above_max_length"
    assert refusal(post(front, "/completions", {**GREEDY, "prompt": [1, -1]}))["param"] == "prompt"
    assert refusal(post(front, "/detokenize", {"tokens": [10 ** 9]}))["param"] == "tokens"
    assert refusal(post(front, "/tokenize", {"prompt": "x", "frobnicate": 1}))["param"] == "frobnicate"
    assert refusal(post(front, "/tokenize", {"model": "heavy", "prompt": "x"}), 404)["code"] == "model_not_found"


def test_a_too_long_token_id_prompt_gets_the_text_prompts_error(front):  # noqa: F811
    limit = tokenize(front, prompt=PROMPT)["max_model_len"]
    text = "x = 1\n" * limit  # more tokens than the context holds
    ids = tokenize(front, prompt=text)["tokens"]
    assert len(ids) > limit
    as_text = refusal(post(front, "/completions", {**GREEDY, "prompt": text}))
    as_ids = refusal(post(front, "/completions", {**GREEDY, "prompt": ids}))
    assert as_ids == as_text and as_ids["param"] == "prompt"
