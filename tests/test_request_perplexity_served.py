"""Request-level routing with the light model's perplexity, through a real tritonserver (tiny pair).

With ``request_policy`` on and ``ab_route_percent`` 0 every request without ``router_mode``
is decided by the request-level policy. The router scores the prompt on the light branch
first: the NLL it reports equals the same light ONNX model's, computed in process on the
same chunks, and the mode it chose is the policy's decision on that perplexity — which for
the code prompts here is verify, where the rules alone would route.
"""
from __future__ import annotations

import asyncio
import math
import shutil

import pytest

from support.triton_repo import set_params
from tokenrouter_backend.branches.in_process import InProcessBranch
from tokenrouter_backend.client import triton_client
from tokenrouter_backend.core.protocol.names import LIGHT, Mode
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.signals.prompt_segments import TokenSurprise
from tokenrouter_backend.core.signals.prompt_surprise import measure
from tokenrouter_backend.engine.branch_engine import BranchEngine
from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM
from tokenrouter_backend.operations.request_policy import RequestPolicyConfig, decide
from tokenrouter_backend.operations.route_setup import vocabulary_texts

pytestmark = pytest.mark.triton

CHUNK = 16
PROMPTS = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return",
           "class Stack:\n    def __init__(self):\n        self.items = []\n",
           "for i in range(10):\n    total = total + i\nprint(total)\n",
           "Say hello to the red club and the blue club, then wave goodbye to everyone there"]


def test_request_level_routing_reads_the_light_models_perplexity(tiny_repository, tmp_path, start_triton):
    from tokenizers import Tokenizer

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository, repo, symlinks=True)
    set_params(repo / "router" / "config.pbtxt", request_policy="true", ab_route_percent="0",
               request_perplexity_chunk=str(CHUNK), mode="route")
    tokenizer = Tokenizer.from_file(str(repo / "router" / "1" / "tokenizer" / "tokenizer.json"))
    texts = vocabulary_texts(tokenizer)
    light = InProcessBranch(LIGHT, BranchEngine(OnnxCausalLM(repo / "light" / "1"), name=LIGHT))
    config = RequestPolicyConfig(policy=True, perplexity_chunk=CHUNK)
    params = RouterDefaults(mode=Mode.ROUTE).request_params({})
    server = start_triton(repo)
    url = server.http_url.replace("http://", "")
    changed = 0
    for i, prompt in enumerate(PROMPTS):
        stats = triton_client.generate_http(url, prompt, max_tokens=8).stats
        ids = tokenizer.encode(prompt).ids
        reference = asyncio.run(measure(light, ids, session_id=100 + i, max_tokens=config.perplexity_tokens,
                                        chunk_tokens=CHUNK))
        assert stats["prompt_nll_tokens"] == reference.scored == len(ids) - math.ceil(len(ids) / CHUNK)
        assert stats["prompt_nll"] == pytest.approx(reference.mean, abs=2e-3)
        assert stats["prompt_score_ms"] > 0
        surprise = TokenSurprise.of(reference.nll, [texts[t] for t in ids])
        expected = decide(config, params, prompt, surprise)[0].mode
        assert stats["mode"] == expected.value
        changed += expected != decide(config, params, prompt)[0].mode
    assert changed >= 1  # the perplexity decided at least one request the rules alone would route otherwise
    explicit = triton_client.generate_http(url, PROMPTS[0], max_tokens=8, router_mode="route").stats
    assert explicit["prompt_nll"] == -1 and explicit["prompt_nll_tokens"] == 0  # not decided by the policy
    health = triton_client.generate_http(url, PROMPTS[1], max_tokens=4, router_mode="heavy").stats
    assert health["generated_tokens"] > 0
