"""``n`` and ``best_of`` through the OpenAI front on a real tritonserver (tiny pair): choices
with their own seeds (seed + j), repeating for a seeded request; the prompt prefilled once per
branch and read by the other choices (routing_stats reuse); streamed chunks by index;
best_of ranked by cumulative log-probability; usage summed; refusals by name. ~1.5 min."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from tokenrouter_backend.client.triton_client import generate_http
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

PROMPT = Path(shutil.__file__).read_text()[:600]  # several prefix-cache blocks
SAMPLED = {"temperature": 0.9, "seed": 5, "max_tokens": 12, "router_mode": "heavy", "answer_cache": False}


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


@pytest.fixture(scope="module")
def front(server, tiny_repository):
    with OpenAIFront(FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR), port=0) as f:
        yield f


def complete(front, **body):
    resp = requests.post(f"{front.url}/completions", json={"model": "tokenrouter", "prompt": PROMPT, **body},
                         timeout=300)
    return resp.status_code, resp.json()


def test_n_choices_have_their_own_seeds_and_repeat(front, server):
    from openai.types import Completion

    status, raw = complete(front, n=3, **SAMPLED)
    assert status == 200
    body = Completion.model_validate(raw)
    assert [c.index for c in body.choices] == [0, 1, 2]
    url = server.http_url.replace("http://", "")
    singles = [generate_http(url, PROMPT, max_tokens=12, temperature=0.9, random_seed=5 + j, router_mode="heavy",
                             answer_cache=False) for j in range(3)]
    assert [c.text for c in body.choices] == [s.text for s in singles]
    assert len({c.text for c in body.choices}) > 1  # sampled with different seeds
    assert body.usage.completion_tokens == sum(s.stats["generated_tokens"] for s in singles)
    assert body.usage.prompt_tokens == 3 * singles[0].stats["prompt_tokens"]
    again = complete(front, n=3, **SAMPLED)[1]["choices"]
    assert [c["text"] for c in again] == [c.text for c in body.choices]  # a seeded request repeats


def test_the_prompt_is_prefilled_once_per_branch(front):
    status, raw = complete(front, n=3, max_tokens=16, router_mode="verify", answer_cache=False,
                           cache_salt="choices-prefill")  # a tenant of its own: nothing cached before
    assert status == 200
    stats = [c["routing_stats"] for c in raw["choices"]]
    assert stats[0]["heavy_reused_tokens"] == 0  # the first choice prefilled the prompt
    assert all(s["heavy_reused_tokens"] > 0 for s in stats[1:])  # the others read its KV blocks


def test_streamed_choices_carry_their_index(front):
    status, raw = complete(front, n=2, **SAMPLED)
    resp = requests.post(f"{front.url}/completions", json={"model": "tokenrouter", "prompt": PROMPT, "n": 2,
                                                           "stream": True, **SAMPLED}, timeout=300)
    texts = {0: "", 1: ""}
    for line in resp.text.split("\n\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [c["text"] for c in raw["choices"]]


def test_best_of_returns_the_highest_cumulative_log_probability(front, server):
    status, raw = complete(front, best_of=3, **SAMPLED)
    assert status == 200 and len(raw["choices"]) == 1
    url = server.http_url.replace("http://", "")
    candidates = [generate_http(url, PROMPT, max_tokens=12, temperature=0.9, random_seed=5 + j, router_mode="heavy",
                                answer_cache=False, return_log_probs=True) for j in range(3)]
    best = max(candidates, key=lambda c: c.logprobs.cumulative)
    assert raw["choices"][0]["text"] == best.text
    assert raw["usage"]["completion_tokens"] == sum(c.stats["generated_tokens"] for c in candidates)


@pytest.mark.parametrize("body, field", [
    ({"n": 17}, "n"), ({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 17}, "best_of"),
    ({"best_of": 2, "stream": True}, "best_of"), ({"n": 16, "prompt": [PROMPT] * 5}, "n"),
])
def test_bad_counts_are_refused_by_name(front, body, field):
    status, raw = complete(front, max_tokens=2, **body)
    assert status == 400 and raw["error"]["param"] == field
