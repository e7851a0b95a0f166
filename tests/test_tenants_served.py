"""Two tenants on one real tritonserver (tiny pair): a greedy request's ``routing_stats``
show reuse of the answer cache and of the branches' KV prefix blocks only when the earlier
request had the same ``cache_salt``; other salts and salt-less requests see no hit and zero
reused tokens, and get the same text. Through the ensemble (gRPC, and HTTP for a refusal)
and through the OpenAI front. ~1.5 min on 2 CPU cores."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.triton_repo import set_params
from tokenrouter_backend.client.triton_client import GenerationError, generate_grpc, generate_http
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

SOURCE = Path(shutil.__file__).read_text()
ENSEMBLE_PROMPT = SOURCE[:700]  # well over two 32-token blocks
FRONT_PROMPT = SOURCE[700:1400]  # another prompt: the ensemble's requests left nothing for it
REUSE = ("answer_cache_hit", "answer_drafts_proposed", "heavy_reused_tokens", "light_reused_tokens")


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module, tmp_path_factory):
    repo = tmp_path_factory.mktemp("tenants") / "repository"
    shutil.copytree(tiny_repository, repo, symlinks=True)
    # cost model off: every verify request asks the light model too (on the tiny pair the cost
    # model soon leaves it out), so both branches' prefix caches are read
    set_params(repo / "router" / "config.pbtxt", cost_model="false", prefill_chunk_tokens=32)
    return start_triton_module(repo)


def reuse(stats: dict) -> dict:
    return {k: stats[k] for k in REUSE}


def no_reuse(stats: dict) -> bool:
    return not stats["answer_cache_hit"] and stats["answer_drafts_proposed"] == 0 \
        and stats["heavy_reused_tokens"] == 0 and stats["light_reused_tokens"] == 0


def reused(stats: dict) -> bool:
    return stats["answer_cache_hit"] and stats["answer_drafts_proposed"] > 0 and stats["heavy_reused_tokens"] > 0


def test_tenants_share_nothing_through_the_ensemble(server):
    def ask(salt=None, **knobs):
        r = generate_grpc(server.grpc_url, ENSEMBLE_PROMPT, max_tokens=16, router_mode="verify",
                          cache_salt=salt, **knobs)
        return r.text, r.stats

    a1, a1_stats = ask("tenant-a")
    a2, a2_stats = ask("tenant-a")
    assert no_reuse(a1_stats), reuse(a1_stats)  # a fresh server
    assert reused(a2_stats), reuse(a2_stats)  # the same tenant again: its answer and its prompt's KV
    b1, b1_stats = ask("tenant-b")  # another tenant, the same prompt
    assert no_reuse(b1_stats), reuse(b1_stats)
    n1, n1_stats = ask()  # salt-less: a tenant of its own
    assert no_reuse(n1_stats), reuse(n1_stats)
    n2, n2_stats = ask()  # ... shared by every salt-less request
    assert reused(n2_stats), reuse(n2_stats)
    b2, b2_stats = ask("tenant-b")
    assert reused(b2_stats), reuse(b2_stats)
    assert a1 and a1 == a2 == b1 == b2 == n1 == n2  # the salt changes no answer
    # the light branch's blocks too (the answer cache off: every request prefills the light model)
    c1_stats = ask("tenant-c", answer_cache=False)[1]
    a3_stats = ask("tenant-a", answer_cache=False)[1]
    assert c1_stats["heavy_reused_tokens"] == c1_stats["light_reused_tokens"] == 0, reuse(c1_stats)
    assert a3_stats["heavy_reused_tokens"] > 0 and a3_stats["light_reused_tokens"] > 0, reuse(a3_stats)


def test_a_bad_salt_is_refused_by_name(server):
    for salt in ("x" * 257, "é" * 129):
        with pytest.raises(GenerationError, match="cache_salt is 25[78] bytes; at most 256 allowed"):
            generate_http(server.http_url.removeprefix("http://"), "hi", max_tokens=2, cache_salt=salt)
    assert generate_grpc(server.grpc_url, "hi", max_tokens=2, cache_salt="x" * 256).stats["generated_tokens"] > 0


def test_tenants_share_nothing_through_the_openai_front(server, tiny_repository):
    openai = pytest.importorskip("openai")
    config = FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR, None)
    with OpenAIFront(config, port=0) as front:
        client = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=120)

        def ask(salt=None):
            extra = {"router_mode": "verify"} | ({"cache_salt": salt} if salt is not None else {})
            r = client.completions.create(model="tokenrouter", prompt=FRONT_PROMPT, max_tokens=16, extra_body=extra)
            return r.choices[0].text, r.model_extra["routing_stats"]

        runs = [ask("tenant-a"), ask("tenant-a"), ask("tenant-b"), ask()]
        assert no_reuse(runs[0][1]) and reused(runs[1][1]), [reuse(s) for _, s in runs]
        assert no_reuse(runs[2][1]) and no_reuse(runs[3][1]), [reuse(s) for _, s in runs]
        assert len({text for text, _ in runs}) == 1
        for salt, words in (("", "non-empty"), ("x" * 257, "257 bytes")):
            with pytest.raises(openai.BadRequestError) as info:
                ask(salt)
            assert info.value.body["param"] == "cache_salt" and words in info.value.body["message"]
