"""Reuse through a real tritonserver (tiny pair): the prefix cache and n-gram drafts change
no output token.

The same prompts — many sharing a long prefix, cut at different lengths (block-aligned or
mid-block), one repeated whole, sent in prefill chunks of 32 tokens — go to a server whose
branches have the prefix cache off, then to one with it on (the default); heavy, verify and
sampled verify outputs must agree token for token, and the cache-on server must have reused
prompt KV (routing_stats, branch metrics). n-gram drafts are compared on/off per request on
one server. ~1.5 min on 2 CPU cores.
"""
from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from support.serving_helpers import router_tokens
from support.triton_repo import set_params

pytestmark = pytest.mark.triton

CODE = Path(shutil.__file__).read_text()[:20000]
CHUNK = 32


def repository(tmp_path: Path, tiny_repository: Path, cache: bool, answers: int = 0) -> Path:
    out = tmp_path / f"repo-cache-{cache}-{answers}"
    shutil.copytree(tiny_repository, out, symlinks=True)
    for branch in ("heavy", "light"):
        set_params(out / branch / "config.pbtxt", prefix_cache=str(cache).lower())
    # cost model off: every verify request uses the light model (on the tiny pair the cost
    # model soon finds the light model does not pay and skips it)
    # decision cache off unless asked: a repeated prompt would draft its earlier answer and
    # never ask the light model
    set_params(out / "router" / "config.pbtxt", prefill_chunk_tokens=CHUNK, cost_model="false",
               answer_cache_entries=answers)
    return out


@pytest.fixture(scope="module")
def prompts(tiny_repository) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_repository / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))
    shared = tok.encode(CODE).ids[:150]  # a "system prompt + document": 4 blocks of 32 and 22 tokens
    questions = [tok.encode(q).ids for q in ("\ndef copy(a, b):", "\n# what does rmtree do?", "\nclass X:")]
    return [
        shared + questions[0],
        shared + questions[1],  # same 150-token prefix, another question
        shared[:75] + questions[2],  # prefix ends mid-block (75 = 2 blocks + 11)
        shared[:96] + questions[0],  # prefix ends on a block boundary
        shared + questions[0],  # a repeat of the first prompt
        shared[:20] + questions[1],  # shorter than a block: nothing to reuse
    ]


CASES = (
    {"router_mode": "heavy"},
    {"router_mode": "verify"},
    {"router_mode": "verify", "temperature": 0.8, "random_seed": 5},
)


def outputs(server, prompts) -> tuple[list[list[int]], list[dict]]:
    outs, stats = [], []
    for case in CASES:
        for prompt in prompts:
            tokens, st = router_tokens(server.grpc_url, prompt, max_tokens=24, **case)
            outs.append(tokens)
            stats.append(st)
    return outs, stats


def metric(server, name: str, branch: str) -> float:
    body = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") and f'branch="{branch}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_prefix_cache_changes_no_token(tmp_path, tiny_repository, prompts, start_triton):
    cold = start_triton(repository(tmp_path, tiny_repository, cache=False))
    reference, ref_stats = outputs(cold, prompts)
    assert metric(cold, "tokenrouter_prefix_cache_hit_tokens_total", "heavy") == 0
    cold.stop()
    assert all(s["heavy_reused_tokens"] == 0 and s["light_reused_tokens"] == 0 for s in ref_stats)

    warm = start_triton(repository(tmp_path, tiny_repository, cache=True))
    got, stats = outputs(warm, prompts)
    for i, (a, b) in enumerate(zip(got, reference)):
        assert a == b, f"request {i} ({CASES[i // len(prompts)]}, prompt {i % len(prompts)}) differs with the cache"
    # heavy mode, first round: each 32-token prefill call inside the cached prefix reuses all
    # but its last position (it is fed, to score it); blocks are 32 tokens as the calls
    reused = [s["heavy_reused_tokens"] for s in stats[: len(prompts)]]
    per_call = CHUNK - 1
    assert reused[0] == 0  # the first request found nothing
    assert reused[1] >= 4 * per_call and reused[4] >= 4 * per_call  # the 150-token prefix
    assert reused[2] == 2 * per_call  # prefix cut mid-block at 75: two whole blocks
    assert reused[3] == 3 * per_call  # prefix cut at 96, a block boundary
    assert reused[5] == 0  # less than a block in common
    verify = stats[len(prompts): 2 * len(prompts)]
    assert verify[0]["light_reused_tokens"] == 0  # the light branch's first request
    assert all(s["light_reused_tokens"] > 0 for s in verify[1:5])
    assert not any(s["light_skipped"] for s in verify)
    # a request served in one branch call (a prompt of one chunk, one token) caches its prompt
    # when its session is released: the next request with that prompt reuses it
    one_call = prompts[0][::-1][:CHUNK]
    for mode, key in (("light", "light_reused_tokens"), ("heavy", "heavy_reused_tokens")):
        first = router_tokens(warm.grpc_url, one_call, max_tokens=1, router_mode=mode)[1]
        again = router_tokens(warm.grpc_url, one_call, max_tokens=1, router_mode=mode)[1]
        assert (first[key], again[key]) == (0, CHUNK - 1), (mode, first, again)
    for branch in ("heavy", "light"):
        hits = metric(warm, "tokenrouter_prefix_cache_hit_tokens_total", branch)
        looked = metric(warm, "tokenrouter_prefix_cache_lookup_tokens_total", branch)
        assert 0 < hits <= looked
        assert metric(warm, "tokenrouter_prefix_cache_blocks", branch) > 0
        # requests are done: no session holds KV (the last releases may still be on their way),
        # the idle blocks stay cached
        deadline = time.monotonic() + 20
        while metric(warm, "tokenrouter_kv_bytes", branch) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(warm, "tokenrouter_kv_bytes", branch) == 0
        assert metric(warm, "tokenrouter_prefix_cache_bytes", branch) > 0


def test_ngram_drafts_change_no_token(tmp_path, tiny_repository, prompts, start_triton):
    server = start_triton(repository(tmp_path, tiny_repository, cache=True))
    # a prompt that quotes a function and asks for it again: the answer can copy it
    copy = prompts[0] + prompts[0][-40:] + prompts[0][-40:-30]
    for case in ({"router_mode": "verify"}, {"router_mode": "route", "confidence_threshold": 1.5}):
        on, st_on = router_tokens(server.grpc_url, copy, max_tokens=32, ngram_drafts=True, **case)
        off, st_off = router_tokens(server.grpc_url, copy, max_tokens=32, ngram_drafts=False, **case)
        heavy, _ = router_tokens(server.grpc_url, copy, max_tokens=32, router_mode="heavy")
        assert on == off == heavy, case
        assert st_off["ngram_blocks"] == 0
        assert st_on["ngram_drafts_accepted"] <= st_on["ngram_drafts_proposed"]
        assert st_on["generated_tokens"] == st_on["light_tokens"] + st_on["heavy_tokens"] + st_on["ngram_tokens"]


def test_light_copies_change_no_token(tmp_path, tiny_repository, prompts, start_triton):
    """Route's light model reads n-gram copies in one forward: where route is exact
    (threshold above 1: every draft checked) the answer is heavy's with copies read or not."""
    server = start_triton(repository(tmp_path, tiny_repository, cache=True))
    copy = prompts[0] + prompts[0][-40:] + prompts[0][-40:-30]
    case = {"router_mode": "route", "confidence_threshold": 1.5, "max_tokens": 32}
    on, st_on = router_tokens(server.grpc_url, copy, light_copies=True, **case)
    off, st_off = router_tokens(server.grpc_url, copy, light_copies=False, **case)
    heavy, _ = router_tokens(server.grpc_url, copy, max_tokens=32, router_mode="heavy")
    assert on == off == heavy
    assert st_off["light_copy_blocks"] == 0 and st_on["light_copy_blocks"] > 0
    assert 0 < st_on["light_copy_drafts_accepted"] <= st_on["light_copy_drafts_proposed"]
    assert st_on["ngram_blocks"] == 0 and st_on["generated_tokens"] == st_on["light_tokens"] + st_on["heavy_tokens"]
    print("light copies on/off:", {k: (st_on[k], st_off[k]) for k in
                                   ("light_calls", "drafts_proposed", "light_copy_drafts_accepted", "heavy_calls")})


def test_decision_cache_and_light_kv_window_change_no_token(tmp_path, tiny_repository, prompts, start_triton):
    server = start_triton(repository(tmp_path, tiny_repository, cache=True, answers=16))
    prompt = prompts[1]
    first, st1 = router_tokens(server.grpc_url, prompt, max_tokens=40, router_mode="verify")
    again, st2 = router_tokens(server.grpc_url, prompt, max_tokens=40, router_mode="verify")
    heavy, _ = router_tokens(server.grpc_url, prompt, max_tokens=40, router_mode="heavy")
    assert first == again == heavy
    assert not st1["answer_cache_hit"]
    assert st2["answer_cache_hit"] and st2["answer_drafts_proposed"] > 0
    assert st2["answer_drafts_accepted"] == st2["answer_drafts_proposed"]  # the same model's own answer
    assert st2["heavy_calls"] < st1["heavy_calls"]
    # the light model reading a 160-token prompt through a 32-position window: still lossless
    windowed, st3 = router_tokens(server.grpc_url, prompts[0], max_tokens=24, router_mode="verify",
                                  light_kv_window=32, ngram_drafts=False)
    full, _ = router_tokens(server.grpc_url, prompts[0], max_tokens=24, router_mode="heavy")
    assert windowed == full and st3["light_calls"] > 0
