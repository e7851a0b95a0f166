"""Real traffic through a real tritonserver (tiny pair): long prompts next to short ones,
many long prompts at once, inputs over the limits.

One server on a copy of the tiny repository with small limits: a per-forward token budget
of 64, prefill calls of 32 tokens, KV budgets of a few MiB and the router's max_live_tokens
derived from them as the exporter derives it. ~1 min on 2 CPU cores.
"""
from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from support.triton_repo import set_params
from tokenrouter_backend.client import triton_client
from tokenrouter_backend.engine.onnx_lm import ModelInfo

pytestmark = pytest.mark.triton

FORWARD_TOKENS, CHUNK = 64, 32
KV_MB = {"heavy": 8.0, "light": 4.0}
MAX_INPUT_TOKENS = 1000
CODE = (Path(shutil.__file__).read_text()[:60000])  # plenty of stdlib code to cut prompts from


@pytest.fixture(scope="module")
def limits_repo(tmp_path_factory, tiny_repository) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("traffic") / "repo"
    shutil.copytree(tiny_repository, out, symlinks=True)
    tokens = []
    for branch in ("heavy", "light"):
        set_params(out / branch / "config.pbtxt", kv_cache_budget_mb=KV_MB[branch], max_forward_tokens=FORWARD_TOKENS)
        info = ModelInfo.load(out / branch / "1" / "model.json")
        tokens.append(int(KV_MB[branch] * (1 << 20) / (info.kv_bytes_per_token() * 1.25)))
    live_tokens = min(tokens)
    set_params(out / "router" / "config.pbtxt", prefill_chunk_tokens=CHUNK, max_live_tokens=live_tokens,
               max_input_tokens=MAX_INPUT_TOKENS, max_live_requests=8, queue_timeout_s=120)
    return out, live_tokens


@pytest.fixture(scope="module")
def server(limits_repo, start_triton_module):
    return start_triton_module(limits_repo[0])


@pytest.fixture(scope="module")
def tokenizer(limits_repo):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(limits_repo[0] / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def prompt_of(tokenizer, tokens: int, offset: int = 0) -> str:
    ids = tokenizer.encode(CODE[offset:]).ids[:tokens]
    return tokenizer.decode(ids)


def metrics(server) -> dict:
    body = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r'(tokenrouter_\w+)\{(?:[^}]*branch="(\w+)")?[^}]*\} ([0-9.e+-]+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = out.get((m.group(1), m.group(2)), 0.0) + float(m.group(3))
    return out


def test_short_stream_keeps_flowing_while_long_prompts_prefill(server, tokenizer):
    url = server.grpc_url
    short = prompt_of(tokenizer, 12)
    longs = [prompt_of(tokenizer, 950, offset=3000 * i) for i in range(3)]
    for text in longs:  # warm every shape once
        triton_client.generate_grpc(url, text[:200], max_tokens=2)
    result = {}

    def stream_short():
        r = triton_client.generate_grpc(url, short, router_mode="verify", max_tokens=96, block_size=1,
                                        block_schedule="fixed", stream=True)
        result["short"] = r

    t = threading.Thread(target=stream_short)
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(3) as pool:
        long_results = list(pool.map(lambda p: triton_client.generate_grpc(url, p, router_mode="verify",
                                                                          max_tokens=4), longs))
    long_window = time.perf_counter() - t0
    t.join()
    r = result["short"]
    assert all(lr.stats["prompt_tokens"] >= 900 for lr in long_results)
    assert r.stats["generated_tokens"] == 96 and len(r.chunk_times) >= 20
    prefill = max(lr.ttft_s for lr in long_results)
    # while ~2,850 prompt tokens were prefilled in chunks, the short stream never waited for all of them
    assert max(r.inter_token_gaps) < prefill / 3, (max(r.inter_token_gaps), prefill, long_window)
    m = metrics(server)
    for branch in ("heavy", "light"):
        assert 0 < m[("tokenrouter_branch_forward_tokens_max", branch)] <= FORWARD_TOKENS


def test_many_long_prompts_stay_within_the_kv_budget_and_all_complete(server, tokenizer, limits_repo):
    _, live_tokens = limits_repo
    prompts = [prompt_of(tokenizer, 700, offset=1500 * i) for i in range(12)]
    rss_before = branch_rss(limits_repo[0])
    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda p: triton_client.generate_grpc(server.grpc_url, p, router_mode="verify",
                                                                      max_tokens=24), prompts))
    assert all(r.stats["generated_tokens"] == 24 and r.stats["reprefills"] == 0 for r in results)
    assert 12 * (700 + 24) > 2 * live_tokens  # more than twice what may be live: most had to queue
    deadline = time.monotonic() + 20  # the last releases reach the branches after the answers
    while any(metrics(server)[("tokenrouter_kv_sessions", b)] for b in ("heavy", "light")) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    m = metrics(server)
    for branch in ("heavy", "light"):
        assert m[("tokenrouter_kv_peak_bytes", branch)] <= KV_MB[branch] * (1 << 20)
        assert m.get(("tokenrouter_kv_dropped_sessions_total", branch), 0.0) == 0  # none refused, none expired
        assert m[("tokenrouter_kv_sessions", branch)] == 0  # every session released
    rss_after = branch_rss(limits_repo[0])
    assert set(rss_before) == {"heavy", "light"}, rss_before
    for name, before in rss_before.items():
        assert rss_after[name] - before < 200 << 20, (name, before, rss_after[name])


def test_inputs_over_the_limits_are_refused_by_name_and_the_server_goes_on(server, tokenizer):
    with pytest.raises(triton_client.GenerationError, match="max_input_tokens allows at most 1000"):
        triton_client.generate_grpc(server.grpc_url, prompt_of(tokenizer, 1010), max_tokens=4)
    ok = triton_client.generate_grpc(server.grpc_url, prompt_of(tokenizer, 20), max_tokens=4)
    assert ok.stats["generated_tokens"] == 4
    # the overload opt-in reaches the router (not saturated here: nothing degraded)
    opted = triton_client.generate_grpc(server.grpc_url, prompt_of(tokenizer, 20), max_tokens=4, router_mode="route",
                                        allow_degradation=True)
    assert opted.stats["generated_tokens"] == 4 and opted.stats["degraded_blocks"] == 0


def branch_rss(repo: Path) -> dict[str, int]:
    """Resident bytes of the branch stubs (heavy, light) serving ``repo``, by model name."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "triton_python_backend_stub" in cmd:
            for name in ("heavy", "light"):
                if f"{repo}/{name}/1/model.py" in cmd:
                    out[name] = max(out.get(name, 0), proc.info["memory_info"].rss)
    return out
