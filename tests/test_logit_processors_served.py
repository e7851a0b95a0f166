"""Logit processors through a real tritonserver (tiny pair): under the same presence /
frequency / repetition penalties, logit bias and min_tokens, verify and route (threshold
above 1: every draft checked) answer token for token as heavy-only; the processors change
answers; logit_bias +100 forces a token; ignore_eos; bad values refused by name, the
server still serving; the OpenAI front's fields. ~2 min on 2 CPU cores."""
from __future__ import annotations

import shutil

import pytest
import requests
from test_openai_front import TEMPLATE

from support.triton_repo import set_params
from tokenrouter_backend.client.triton_client import GenerationError, generate_http
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Point:\n    def __init__(self,",
           "for i in range(10):\n   ", "x = [1, 2, 3]\ny =", "# sort a list\ndef sort(xs):", "print('hello", "a = b +"]
SETTINGS = [
    {"frequency_penalty": 1.0},
    {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"repetition_penalty": 1.6},
    # token 0 as the end token, made certain: without min_tokens answers end at once, with it
    # they hold 12 tokens
    {"min_tokens": 12, "logit_bias": {0: 100.0}, "end_id": 0},
]
COMMON = {"max_tokens": 20, "answer_cache": False}


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module, tmp_path_factory):
    repo = tmp_path_factory.mktemp("processors") / "repository"
    shutil.copytree(tiny_repository, repo, symlinks=True)
    set_params(repo / "router" / "config.pbtxt", cost_model="false")  # verify always drafts with the light model
    return start_triton_module(repo)


def ask(server, prompt, mode, **knobs):
    return generate_http(server.http_url.replace("http://", ""), prompt, router_mode=mode, **{**COMMON, **knobs})


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(map(str, s)))
def test_verify_and_checked_route_equal_heavy_only_under_the_same_processors(server, settings):
    changed = 0
    for prompt in PROMPTS:
        heavy = ask(server, prompt, "heavy", **settings)
        plain = ask(server, prompt, "heavy")
        changed += heavy.text != plain.text
        verify = ask(server, prompt, "verify", **settings)
        assert verify.text == heavy.text, prompt
        assert verify.stats["drafts_proposed"] > 0
        route = ask(server, prompt, "route", confidence_threshold=1.5, **settings)
        assert route.text == heavy.text, prompt
        if "min_tokens" in settings:
            assert heavy.stats["generated_tokens"] >= min(settings["min_tokens"], COMMON["max_tokens"])
    assert changed > 0, "the processors changed no answer: the test would not see them ignored"


def test_logit_bias_forces_a_token_and_ignore_eos(server):
    plain = ask(server, PROMPTS[0], "verify")
    forced = ask(server, PROMPTS[0], "verify", logit_bias={13: 100.0})
    heavy = ask(server, PROMPTS[0], "heavy", logit_bias={13: 100.0})
    assert forced.text == heavy.text != plain.text
    once = ask(server, PROMPTS[0], "heavy", max_tokens=1, logit_bias={13: 100.0}).text
    assert once and forced.text == once * (len(forced.text) // len(once))  # token 13, every time
    # the end token as the only choice (bias), then ignore_eos: it no longer ends the answer
    end_id = 0
    stopped = ask(server, PROMPTS[0], "heavy", logit_bias={end_id: 100.0}, end_id=end_id)
    assert stopped.stats["finish_reason"] != "length" and stopped.stats["generated_tokens"] <= 1
    kept = ask(server, PROMPTS[0], "verify", logit_bias={end_id: 100.0}, end_id=end_id, ignore_eos=True)
    assert kept.stats["generated_tokens"] == COMMON["max_tokens"] and kept.stats["finish_reason"] == "length"


def test_min_p_one_samples_the_greedy_answer(server):
    greedy = ask(server, PROMPTS[2], "heavy")
    for mode in ("heavy", "verify"):
        sampled = ask(server, PROMPTS[2], mode, temperature=1.0, random_seed=7, min_p=1.0)
        assert sampled.text == greedy.text  # min_p 1 keeps only the most likely token
    wide = [ask(server, PROMPTS[2], "heavy", temperature=1.5, random_seed=s).text for s in range(4)]
    assert len(set(wide)) > 1  # without it the same temperature does sample
    with pytest.raises(GenerationError, match="min_p"):
        ask(server, PROMPTS[2], "verify", temperature=1.0, min_p=1.5)


def test_stop_token_ids_end_the_answer_before_the_token_ignore_eos_or_not(server):
    greedy = ask(server, PROMPTS[1], "heavy", return_log_probs=True, top_log_probs=1)
    answer = [top[0][0] for top in greedy.logprobs.top]  # greedy, unprocessed: each token is the top-1
    assert len(answer) == COMMON["max_tokens"]
    stop = answer[3]
    for knobs in ({}, {"ignore_eos": True}):
        got = ask(server, PROMPTS[1], "verify", stop_token_ids=[stop], **knobs)
        assert got.stats["generated_tokens"] == answer.index(stop) and got.stats["finish_reason"] != "length"
    with pytest.raises(GenerationError, match="stop_token_ids"):
        ask(server, PROMPTS[1], "verify", stop_token_ids=[10 ** 7])


@pytest.mark.parametrize("knobs, field", [
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3.0}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_tokens": 21}, "min_tokens"),
    ({"logit_bias": {5: 101.0}}, "logit_bias_values"),
    ({"logit_bias": {10 ** 7: 1.0}}, "logit_bias_ids"),
])
def test_bad_values_are_refused_by_name(server, knobs, field):
    with pytest.raises(GenerationError, match=field):
        ask(server, PROMPTS[0], "verify", **knobs)
    assert ask(server, PROMPTS[0], "verify", max_tokens=3).stats["generated_tokens"] == 3


@pytest.fixture(scope="module")
def front(server, tiny_repository, tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(TEMPLATE)
    with OpenAIFront(FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR, template), port=0) as f:
        yield f


def test_openai_fields_reach_the_processors(front, server):
    body = {"model": "tokenrouter", "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
            "frequency_penalty": 1.0, "presence_penalty": 0.5, "logit_bias": {"13": 3}, "answer_cache": False}
    got = requests.post(f"{front.url}/completions", json=body, timeout=120).json()
    ref = ask(server, PROMPTS[1], "verify", max_tokens=16, frequency_penalty=1.0, presence_penalty=0.5,
              logit_bias={13: 3.0})
    assert got["choices"][0]["text"] == ref.text
    extra = {**body, "repetition_penalty": 1.3, "min_tokens": 4, "ignore_eos": True}
    got = requests.post(f"{front.url}/completions", json=extra, timeout=120).json()
    ref = ask(server, PROMPTS[1], "verify", max_tokens=16, frequency_penalty=1.0, presence_penalty=0.5,
              logit_bias={13: 3.0}, repetition_penalty=1.3, min_tokens=4, ignore_eos=True)
    assert got["choices"][0]["text"] == ref.text
    for bad, field in (({"frequency_penalty": 3}, "frequency_penalty"), ({"logit_bias": {"x": 1}}, "logit_bias"),
                       ({"logit_bias": {"5": 200}}, "logit_bias")):
        resp = requests.post(f"{front.url}/completions", json={**body, **bad}, timeout=60)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field
