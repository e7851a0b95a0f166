"""A heavy pool on loopback: two heavy tritonservers and one router whose ``heavy_url`` lists both.

Output must equal the single-server setup token for token with sessions spread over both
heavy servers; one heavy server killed while streams are in flight must not fail them (its
sessions re-prefill on the other); restarted on its port, it gets new sessions again.
"""
from __future__ import annotations

import time

import pytest

from support.serving_helpers import model_stats, router_tokens, scrape_metric
from support.split_setup import (
    MODES,
    PROMPTS,
    ROUTER_MODELS,
    InFlight,
    copy_models,
    crash,
    generate_all,
    set_heavy_url,
    single_server_reference,
)
from tokenrouter_backend.server.ports import free_ports

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

IN_FLIGHT = 8  # streams generating when one heavy server is killed
LONG_TOKENS = 300  # long enough to still run when the kill comes
FINISH_BOUND_S = 120.0  # the streams' whole remaining work on one heavy server, two shared CPU cores
BACK_BOUND_S = 40.0  # restart seen by a readiness check (back-off cap 15 s) and a new session placed there


@pytest.fixture(scope="module")
def tokenizer(tiny_repository):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_repository / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


@pytest.fixture(scope="module")
def single_server_outputs(tiny_repository, tokenizer, tmp_path_factory):
    return single_server_reference(tiny_repository, tokenizer, tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def pool(tiny_repository, single_server_outputs, start_triton_module, tmp_path_factory):
    """(heavy_a, heavy_b, router); the heavy servers on fixed ports so a restart comes back on them."""
    root = tmp_path_factory.mktemp("pool")
    heavies = []
    for name in ("a", "b"):
        repo = copy_models(tiny_repository, root / f"heavy_{name}", ["heavy"])
        http, grpc, metrics = free_ports(3)
        heavies.append(start_triton_module(repo, http_port=http, grpc_port=grpc, metrics_port=metrics))
    router_repo = copy_models(tiny_repository, root / "router_repo", ROUTER_MODELS)
    set_heavy_url(router_repo / "router" / "config.pbtxt", ",".join(server_label(h) for h in heavies))
    router = start_triton_module(router_repo)
    return heavies[0], heavies[1], router


def server_label(heavy) -> str:
    return f"127.0.0.1:{heavy.grpc_port}"


def served(heavy) -> int:
    return model_stats(heavy.http_url, "heavy")["inference_count"]


def pool_metric(router, name: str, heavy, at_least: float, timeout_s: float = 10.0) -> float:
    """The router's per-server metric once it reaches ``at_least`` (metrics are recorded asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = scrape_metric(router.metrics_url, name, {"server": server_label(heavy)})
        except KeyError:
            value = float("nan")
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_pool_output_equals_single_server_with_sessions_on_both(pool, single_server_outputs, tokenizer):
    heavy_a, heavy_b, router = pool
    before = served(heavy_a), served(heavy_b)
    got = generate_all(router.grpc_url, tokenizer)
    for key, tokens in got.items():
        assert tokens == single_server_outputs[key], f"{key[1]} on {key[0]!r} differs from the single server"
    assert served(heavy_a) > before[0] and served(heavy_b) > before[1], "sessions did not spread over both"
    for heavy in (heavy_a, heavy_b):
        assert pool_metric(router, "tokenrouter_router_heavy_server_sessions_total", heavy, 1) >= 1
        assert pool_metric(router, "tokenrouter_router_heavy_server_up", heavy, 1) == 1


def test_killed_heavy_server_lets_streams_finish_on_the_other(pool, tokenizer):
    heavy_a, heavy_b, router = pool
    ids = [tokenizer.encode(p).ids for p in PROMPTS]
    streams = InFlight(router.grpc_url, ids, MODES, LONG_TOKENS, IN_FLIGHT)
    try:
        streams.wait_generating(60)
        a_before = served(heavy_a)
        assert a_before > 0
        t_kill = time.monotonic()
        crash(heavy_a)
        outcomes = streams.outcomes(FINISH_BOUND_S)
        took = [end - t_kill for end in streams.ended_at]
    finally:
        streams.close()
    errors = [error for _, _, error in outcomes if error is not None]
    assert not errors, f"{len(errors)} of {IN_FLIGHT} streams failed: {errors[0]}"
    assert all(len(tokens) > 0 for tokens, _, _ in outcomes)
    reprefills = sum(stats.get("reprefills", 0) for _, stats, _ in outcomes)
    assert reprefills > 0, "no session was re-prefilled: none lived on the killed server"
    assert pool_metric(router, "tokenrouter_router_heavy_server_failovers_total", heavy_a, reprefills) >= reprefills
    assert pool_metric(router, "tokenrouter_router_heavy_server_up", heavy_a, 0) == 0
    print(f"\n{IN_FLIGHT} streams, one heavy server killed: all done {max(took):.1f} s after the kill, "
          f"{reprefills} sessions re-prefilled on the other")
    tokens, _ = router_tokens(router.grpc_url, ids[2], router_mode="verify", max_tokens=8)
    assert len(tokens) == 8  # new requests keep working on the survivor


def test_restarted_heavy_server_gets_new_sessions_again(pool, tokenizer):
    heavy_a, _, router = pool
    if not heavy_a.is_running():
        heavy_a.start()  # same ports as before
        heavy_a.wait_ready(120)
    t_ready = time.monotonic()
    before = served(heavy_a)
    ids = tokenizer.encode(PROMPTS[3]).ids
    while served(heavy_a) == before:
        assert time.monotonic() - t_ready < BACK_BOUND_S, "the restarted heavy server gets no sessions"
        for _ in range(4):  # a few new sessions: some rank the restarted server first
            assert len(router_tokens(router.grpc_url, ids, router_mode="heavy", max_tokens=2)[0]) == 2
        time.sleep(0.5)
    assert pool_metric(router, "tokenrouter_router_heavy_server_up", heavy_a, 1) == 1
    print(f"\nrestarted heavy server serves new sessions {time.monotonic() - t_ready:.1f} s after it was ready")
