"""Through a real tritonserver (tiny pair): a server whose first requests ran heavy-only steps
still learns that drafting pays — the cost model explores the unmeasured light model.

The private copy's router prices the light model at 4 heavy forwards until it is measured
(``cost_light_ratio`` 4), so the priors alone would keep every verify request heavy-only for
the server's life; ``cost_min_samples`` is small so a few heavy requests fit the heavy curve.
``cost_explore_share`` is 1: whether a 4-forward prefill of a few tokens is under a quarter of
32 heavy steps depends on how the fitted curve splits fixed and per-token cost, which a busy
machine moves (a CI run failed on it); under all of them it is the point of this test.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from test_ops_server import scrape, set_router_params, total

from tokenrouter_backend.client import triton_client

pytestmark = pytest.mark.triton

PROMPTS = ["def add(a, b):", "for i in range(", "import numpy as", "class Stack:", "while True:", "print(",
           "def fib(n):", "x = [i for i in", "with open(", "if __name__ =="]
NO_REUSE = {"answer_cache": False, "ngram_drafts": False}  # drafts from the light model only


@pytest.fixture(scope="module")
def repository(tmp_path_factory, tiny_repository) -> Path:
    out = tmp_path_factory.mktemp("explore_repo") / "repo"
    shutil.copytree(tiny_repository, out, symlinks=True)
    set_router_params(out, cost_light_ratio="4.0", cost_min_samples="8", cost_explore_share="1.0")
    return out


def settled(url: str, name: str, ok, **labels) -> float:
    """The metric once ``ok(value)`` holds (metric writes go through the router's recorder
    thread, after the response), or its last value after 10 s."""
    deadline = time.time() + 10
    while True:
        value = total(scrape(url), name, **labels)
        if ok(value) or time.time() > deadline:
            return value
        time.sleep(0.2)


def test_heavy_only_start_then_verify_explores_and_measures_the_light_model(repository, start_triton):
    server = start_triton(repository)
    url = server.http_url.replace("http://", "")
    heavy = {p: triton_client.generate_http(url, p, max_tokens=32, router_mode="heavy", **NO_REUSE)
             for p in PROMPTS[:4]}
    fixed = "tokenrouter_router_cost_fixed_ms"
    assert settled(server.metrics_url, fixed, lambda v: v >= 0, branch="heavy") >= 0  # the heavy curve is fitted
    assert total(scrape(server.metrics_url), fixed, branch="light") == -1  # the light model never ran
    stalls = [v for (n, lab), v in scrape(server.metrics_url).items()
              if n == "tokenrouter_router_cost_stall_ratio" and 'branch="heavy"' in lab]
    assert len(stalls) == 1 and 0 <= stalls[0] < 0.5  # exported beside the curve; a quiet test server barely stalls

    first = triton_client.generate_http(url, PROMPTS[0], max_tokens=32, router_mode="verify", **NO_REUSE)
    s = first.stats
    assert s["light_plan_explored"] and not s["light_skipped"], s
    assert s["light_calls"] > 0 and s["drafts_proposed"] > 0  # the prior alone would have run heavy-only steps
    assert s["light_plan_saving_ms"] < s["light_plan_prefill_ms"]  # what the prior said
    assert first.text == heavy[PROMPTS[0]].text  # exploring is still verify: the heavy model's own answer

    stats = [s]
    for prompt in PROMPTS[1:] * 3:  # until the light model is measured (curve and verdicts)
        stats.append(triton_client.generate_http(url, prompt, max_tokens=32, router_mode="verify",
                                                 **NO_REUSE).stats)
        if not stats[-1]["light_plan_explored"]:
            break
    decided = stats[-1]
    assert not decided["light_plan_explored"] and decided["light_plan_prefill_ms"] > 0  # the curves decide now
    assert settled(server.metrics_url, fixed, lambda v: v >= 0, branch="light") >= 0  # fitted by the explorers
    explored = sum(st["light_plan_explored"] for st in stats)
    counted = settled(server.metrics_url, "tokenrouter_router_light_explored_total", lambda v: v == explored)
    assert counted == explored >= 1
