"""Log-probabilities through a real tritonserver (tiny pair): the ensemble's
``return_log_probs`` / ``top_log_probs`` inputs and its log-prob outputs, over HTTP and gRPC,
streamed and not; verify's numbers equal heavy-only's for the same greedy request and are
the heavy model's; route names the model of each number; bad values refused by name; and
the OpenAI front's ``logprobs`` / ``top_logprobs`` shapes, validated by the ``openai``
client's own types. ~1.5 min on 2 CPU cores."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import requests
from test_openai_front import TEMPLATE

from support.triton_repo import set_params
from tokenrouter_backend.client.triton_client import GenerationError, generate_grpc, generate_http
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Point:\n    def __init__(self,",
           "for i in range(10):\n   "]
NO_REUSE = {"answer_cache": False}


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module, tmp_path_factory):
    repo = tmp_path_factory.mktemp("logprobs") / "repository"
    shutil.copytree(tiny_repository, repo, symlinks=True)
    set_params(repo / "router" / "config.pbtxt", cost_model="false")  # verify always drafts with the light model
    return start_triton_module(repo)


def url(server) -> str:
    return server.http_url.replace("http://", "")


def ask(server, prompt, mode, stream=False, transport="http", **knobs):
    knobs = {"max_tokens": 24, "router_mode": mode, "return_log_probs": True, "top_log_probs": 3,
             **NO_REUSE, **knobs}
    if transport == "grpc":
        return generate_grpc(server.grpc_url.replace("grpc://", ""), prompt, stream=stream, **knobs)
    return generate_http(url(server), prompt, stream=stream, **knobs)


def test_verify_numbers_are_heavy_onlys_over_http_and_grpc_streamed_or_not(server):
    for prompt in PROMPTS:
        heavy = ask(server, prompt, "heavy")
        tokens = heavy.stats["generated_tokens"]
        assert len(heavy.logprobs.log_probs) == tokens > 0 and set(heavy.logprobs.branches) == {"heavy"}
        assert all(lp <= 0 for lp in heavy.logprobs.log_probs)
        assert heavy.logprobs.cumulative == pytest.approx(sum(heavy.logprobs.log_probs), abs=1e-3)
        for top, lp in zip(heavy.logprobs.top, heavy.logprobs.log_probs):
            assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1]
            assert top[0][1] == pytest.approx(lp, abs=1e-4)  # greedy: the answer token is the top-1
        for stream, transport in ((False, "http"), (True, "http"), (True, "grpc")):
            got = ask(server, prompt, "verify", stream=stream, transport=transport)
            assert got.text == heavy.text and got.stats["drafts_proposed"] > 0
            assert set(got.logprobs.branches) == {"heavy"}
            np.testing.assert_allclose(got.logprobs.log_probs, heavy.logprobs.log_probs, atol=1e-3)
            assert [[t for t, _ in top] for top in got.logprobs.top] == [[t for t, _ in top] for top in
                                                                          heavy.logprobs.top]


def test_route_names_the_model_of_each_number(server):
    seen = set()
    for prompt in PROMPTS:
        got = ask(server, prompt, "route", confidence_threshold=0.0, rollback_window=1)
        assert len(got.logprobs.log_probs) == got.stats["generated_tokens"]
        assert all(math.isfinite(lp) and lp <= 0 for lp in got.logprobs.log_probs)
        seen |= set(got.logprobs.branches)
    assert seen == {"heavy", "light"}


def test_not_asked_means_empty_outputs_and_bad_values_are_refused_by_name(server):
    plain = generate_http(url(server), PROMPTS[0], max_tokens=8, router_mode="verify")
    assert plain.logprobs.log_probs == [] and plain.logprobs.top == []
    with pytest.raises(GenerationError, match="top_log_probs"):
        ask(server, PROMPTS[0], "verify", top_log_probs=21)
    with pytest.raises(GenerationError, match="top_log_probs needs return_log_probs"):
        ask(server, PROMPTS[0], "verify", return_log_probs=False)
    assert ask(server, PROMPTS[0], "verify", max_tokens=4).stats["generated_tokens"] == 4  # still serving


@pytest.fixture(scope="module")
def front(server, tiny_repository, tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(TEMPLATE)
    config = FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR, template)
    with OpenAIFront(config, port=0) as f:
        yield f


def test_openai_completions_and_chat_logprobs_shapes_and_numbers(front, server):
    openai = pytest.importorskip("openai")
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    ref = ask(server, PROMPTS[0], "heavy", max_tokens=12)
    body = {"model": "tokenrouter", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "logprobs": 2,
            "router_mode": "verify", **NO_REUSE}
    raw = requests.post(f"{front.url}/completions", json=body, timeout=120).json()
    done = Completion.model_validate(raw)
    lp = done.choices[0].logprobs
    assert done.choices[0].text == ref.text
    np.testing.assert_allclose(lp.token_logprobs, ref.logprobs.log_probs, atol=1e-3)
    # the tokens spell the text, unless one holds part of a character (it reads U+FFFD) or the end token
    if done.choices[0].finish_reason == "length" and not any("\ufffd" in t for t in lp.tokens):
        assert "".join(lp.tokens) == ref.text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert raw["choices"][0]["logprobs"]["branches"] == ["heavy"] * len(lp.tokens)

    chat = {"model": "tokenrouter", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 10,
            "temperature": 0, "logprobs": True, "top_logprobs": 3, "router_mode": "verify", **NO_REUSE}
    raw = requests.post(f"{front.url}/chat/completions", json=chat, timeout=120).json()
    reply = ChatCompletion.model_validate(raw)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    if reply.choices[0].finish_reason == "length":  # no end token among them
        text = reply.choices[0].message.content
        assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace") == text
        assert any("\ufffd" in t.token for t in content) or "".join(t.token for t in content) == text
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-4)
        assert "\ufffd" in t.token or bytes(t.bytes) == t.token.encode()

    # streamed: the chunks' logprobs add up to the non-streamed answer's
    client = openai.OpenAI(base_url=front.url, api_key="none")
    events = client.chat.completions.create(**{k: v for k, v in chat.items() if k not in ("router_mode",
                                                                                         "answer_cache")},
                                            stream=True, extra_body={"router_mode": "verify", **NO_REUSE})
    streamed = [t for e in events if e.choices and e.choices[0].logprobs for t in e.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    np.testing.assert_allclose([t.logprob for t in streamed], [t.logprob for t in content], atol=1e-3)

    bad = requests.post(f"{front.url}/chat/completions", json={**chat, "top_logprobs": 21}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"
    bad = requests.post(f"{front.url}/completions", json={**body, "logprobs": 6}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprobs"


def test_prompt_log_probs_score_the_prompt_once_and_max_tokens_0_answers_nothing(server, tiny_repository):
    """The heavy model's numbers for every prompt token after the first: the same as the
    numbers it gives the same tokens generated as an answer (its own greedy continuation,
    scored again as a prompt), within float tolerance; max_tokens 0 generates nothing."""
    from tokenrouter_backend.client.triton_client import LogprobsOut  # noqa: F401 (the outputs' reader)

    first = ask(server, PROMPTS[1], "heavy", max_tokens=12)
    whole = PROMPTS[1] + first.text
    scored = generate_http(url(server), whole, max_tokens=0, return_prompt_log_probs=True, top_log_probs=2,
                           router_mode="verify", **NO_REUSE)
    assert scored.stats["generated_tokens"] == 0 and scored.text == "" and scored.stats["finish_reason"] == "length"
    prompt_lps = scored.logprobs.prompt_log_probs
    assert len(prompt_lps) == scored.stats["prompt_tokens"] - 1
    # the answer's tokens re-read as the prompt's tail (when the text re-tokenizes to the same tokens)
    tail = prompt_lps[-len(first.logprobs.log_probs):]
    if scored.stats["prompt_tokens"] == first.stats["prompt_tokens"] + first.stats["generated_tokens"]:
        np.testing.assert_allclose(tail, first.logprobs.log_probs, atol=1e-3)
    assert all(len(t) == 2 and t[0][1] >= t[1][1] for t in scored.logprobs.prompt_top)
    # with an answer too: the prompt's come in the first response, the answer's as before
    both = ask(server, PROMPTS[1], "verify", stream=True, max_tokens=12, return_prompt_log_probs=True)
    assert both.text == first.text
    np.testing.assert_allclose(both.logprobs.log_probs, first.logprobs.log_probs, atol=1e-3)
    assert len(both.logprobs.prompt_log_probs) == both.stats["prompt_tokens"] - 1
    with pytest.raises(GenerationError, match="max_tokens"):
        generate_http(url(server), PROMPTS[0], max_tokens=0, router_mode="verify")


def test_openai_echo_logprobs_scores_the_prompt(front, server):
    """lm-eval's loglikelihood request: echo, logprobs, max_tokens 0 — the prompt's tokens with
    the heavy model's numbers, the first null (as OpenAI and vLLM answer; the ``openai``
    package's ``Completion`` type says float, so strict ``model_validate`` refuses that null,
    while the client itself reads it), the same numbers the ensemble returns."""
    openai = pytest.importorskip("openai")

    prompt = PROMPTS[2]
    ref = generate_http(url(server), prompt, max_tokens=0, return_prompt_log_probs=True, top_log_probs=1,
                        router_mode="verify", **NO_REUSE)
    client = openai.OpenAI(base_url=front.url, api_key="none")
    done = client.completions.create(model="tokenrouter", prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                     temperature=0, extra_body=NO_REUSE)
    lp = done.choices[0].logprobs
    assert done.choices[0].text == prompt and done.usage.completion_tokens == 0
    assert len(lp.tokens) == done.usage.prompt_tokens == ref.stats["prompt_tokens"]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:], ref.logprobs.prompt_log_probs, atol=1e-4)
    assert [list(t.values())[0] for t in lp.top_logprobs[1:]] == pytest.approx(
        [top[0][1] for top in ref.logprobs.prompt_top], abs=1e-4)
    assert "".join(lp.tokens) == prompt or any("\ufffd" in t for t in lp.tokens)
    # with an answer: the prompt's tokens, then the answer's (streamed: the same)
    done = client.completions.create(model="tokenrouter", prompt=prompt, max_tokens=6, echo=True, logprobs=1,
                                     temperature=0, extra_body=NO_REUSE)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == done.usage.prompt_tokens + done.usage.completion_tokens
    assert done.choices[0].text.startswith(prompt)
    events = client.completions.create(model="tokenrouter", prompt=prompt, max_tokens=6, echo=True, logprobs=1,
                                       temperature=0, extra_body=NO_REUSE, stream=True)
    streamed = [t for e in events if e.choices and e.choices[0].logprobs for t in e.choices[0].logprobs.tokens]
    assert streamed == lp.tokens


def test_openai_several_prompts_each_choice_has_its_own_logprobs(front):
    from openai.types import Completion

    body = {"model": "tokenrouter", "max_tokens": 6, "temperature": 0, "logprobs": 1, **NO_REUSE}
    alone = [Completion.model_validate(requests.post(f"{front.url}/completions", json={**body, "prompt": p},
                                                     timeout=120).json()).choices[0].logprobs for p in PROMPTS[:2]]
    both = Completion.model_validate(requests.post(f"{front.url}/completions", json={**body, "prompt": PROMPTS[:2]},
                                                   timeout=120).json())
    for choice, single in zip(both.choices, alone):
        assert choice.logprobs.tokens == single.tokens and choice.logprobs.text_offset == single.text_offset
        np.testing.assert_allclose(choice.logprobs.token_logprobs, single.token_logprobs, atol=1e-3)


def test_prompt_log_probs_equal_a_transformers_forward_of_the_heavy_model(server, tiny_repository):
    """The issue's bound: the served prompt log-probabilities against the heavy model's own
    transformers forward (FP32), within the exporter's validation tolerance (relative to the
    logits' scale; a log-probability moves by at most twice a logit's error)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenrouter_backend.export.tiny_pair import build_tiny_pair
    from tokenrouter_backend.export.validate import FP32_REL_TOL
    from tokenrouter_backend.server import paths

    prompt = PROMPTS[2] * 3
    served = generate_http(url(server), prompt, max_tokens=0, return_prompt_log_probs=True, router_mode="verify",
                           **NO_REUSE)
    ids = AutoTokenizer.from_pretrained(str(tiny_repository / TOKENIZER_DIR))(prompt)["input_ids"]
    assert len(ids) == served.stats["prompt_tokens"]  # the served tokenizer's ids
    heavy_dir, _ = build_tiny_pair(paths.tiny_dir())  # the pair the repository was exported from (cached)
    model = AutoModelForCausalLM.from_pretrained(str(heavy_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    reference = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    tolerance = 2 * FP32_REL_TOL * max(float(logits.abs().max()), 1.0)
    got = np.asarray(served.logprobs.prompt_log_probs)
    assert len(got) == len(reference)
    assert float(np.abs(got - reference).max()) <= tolerance
