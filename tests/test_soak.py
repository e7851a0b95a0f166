"""Bounded soak: many streams cancelled at random points leave no session, no KV byte and
no memory growth behind (real tritonserver, tiny pair, loopback only).

``TOKENROUTER_SOAK_STREAMS`` sets the count (default 200 in CI; the issue's 1000:
``TOKENROUTER_SOAK_STREAMS=1000 pytest tests/test_soak.py``). Each stream asks for up to
``MAX_TOKENS`` tokens and is cancelled after a random number of responses (0: before the
first). Afterwards both branches' ``tokenrouter_kv_sessions`` and ``tokenrouter_kv_bytes``
must return to 0 and the server's resident memory (server + stubs) may grow by at most
``RSS_GROWTH_LIMIT_MB``.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import random
import time
from pathlib import Path

import numpy as np
import pytest

from support.serving_helpers import scrape_metric
from tokenrouter_backend.client.triton_client import generate_http

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

STREAMS = int(os.environ.get("TOKENROUTER_SOAK_STREAMS", "200"))
MAX_TOKENS = 48
CONCURRENCY = 4
RSS_GROWTH_LIMIT_MB = 100.0  # measured growth is reported in the assertion message
SETTLE_S = 120.0  # cancelled ensemble streams may still run to max_tokens (docs/security.md)
MODES = ("verify", "route", "heavy", "light")


def rss_mb(pids) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def cancelled_stream(grpc_url: str, seed: int) -> int:
    """One streaming request cancelled after a random number of responses; returns that number."""
    import tritonclient.grpc as grpcclient

    rng = random.Random(seed)
    def tensor(name, value, dtype, kind):
        t = grpcclient.InferInput(name, [1, 1], kind)
        t.set_data_from_numpy(np.array([[value]], dtype=dtype))
        return t

    inputs = [tensor("text_input", f"def f{seed}(x):\n    ".encode(), np.object_, "BYTES"),
              tensor("max_tokens", MAX_TOKENS, np.int32, "INT32"), tensor("stream", True, bool, "BOOL"),
              tensor("router_mode", rng.choice(MODES).encode(), np.object_, "BYTES")]
    wait_for = rng.choice([0, 0, 1, 2, 3, 5, 8])
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    seen = 0
    try:
        client.async_stream_infer("tokenrouter", inputs)
        while seen < wait_for:
            _, error = got.get(timeout=60)
            if error is not None:
                break
            seen += 1
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return seen


def live(server) -> list[float]:
    return [scrape_metric(server.metrics_url, name, {"branch": b})
            for name in ("tokenrouter_kv_sessions", "tokenrouter_kv_bytes") for b in ("heavy", "light")]


def test_cancelled_streams_leak_nothing(tiny_repository, start_triton):
    server = start_triton(tiny_repository)
    host = server.http_url.removeprefix("http://")
    for mode in MODES:  # warm-up: every code path has run once before memory is measured
        generate_http(host, "import os\n", max_tokens=8, router_mode=mode)
    before = rss_mb(server.group_pids())
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(CONCURRENCY) as pool:
        seen = list(pool.map(lambda s: cancelled_stream(server.grpc_url, s), range(STREAMS)))
    took = time.monotonic() - t0
    assert server.is_ready()
    deadline = time.monotonic() + SETTLE_S
    while (values := live(server)) != [0.0] * 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert values == [0.0] * 4, f"after {STREAMS} cancelled streams: sessions heavy/light, " \
                                f"KV bytes heavy/light = {values}"
    growth = rss_mb(server.group_pids()) - before
    assert growth < RSS_GROWTH_LIMIT_MB, f"resident memory grew {growth:.0f} MB over {STREAMS} streams"
    assert sum(1 for s in seen if s > 0) > STREAMS // 3, "too few streams were cancelled mid-generation"
    print(f"{STREAMS} streams in {took:.1f} s; RSS {before:.0f} MB -> +{growth:.1f} MB")
    assert generate_http(host, "def f():", max_tokens=4).tokens == 4

