"""Two real tritonservers on loopback: a heavy server (only ``heavy``) and a router server
(router, light, pre/post-processing, ensemble) whose router reaches heavy over gRPC through
its ``heavy_url`` parameter. Output must equal the single-server setup token for token;
a killed heavy server must fail requests quickly with an error naming the heavy branch (its
URL in the router's log only) while the router stays up — also the streams in flight when
it dies, each within a bound — and the router must recover when heavy returns on its port.
"""
from __future__ import annotations

import time
import urllib.error

import pytest

from support.branch_calls import branch_call
from support.serving_helpers import model_stats, router_tokens
from support.split_setup import (
    MAX_TOKENS,
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
from tokenrouter_backend.core.protocol.branch_auth import KEY_ENV, KEY_FILE
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp
from tokenrouter_backend.server.ports import free_ports
from tokenrouter_backend.server.process import TritonServer

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

FAIL_FAST_S = 10.0  # RemoteBranch: 4 attempts, backoff 0.25 + 0.5 + 1 s; refused connects are instant
IN_FLIGHT = 6  # streams generating when the heavy server is killed
LONG_TOKENS = 400  # long enough to still run when the kill comes


@pytest.fixture(scope="module")
def tokenizer(tiny_repository):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_repository / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


@pytest.fixture(scope="module")
def single_server_outputs(tiny_repository, tokenizer, tmp_path_factory):
    return single_server_reference(tiny_repository, tokenizer, tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def split(tiny_repository, single_server_outputs, start_triton_module, tmp_path_factory):
    """(heavy_server, router_server); heavy on fixed ports so a restart comes back on them."""
    root = tmp_path_factory.mktemp("split")
    heavy_repo = copy_models(tiny_repository, root / "heavy_repo", ["heavy"])
    router_repo = copy_models(tiny_repository, root / "router_repo", ROUTER_MODELS)
    http, grpc, metrics = free_ports(3)
    set_heavy_url(router_repo / "router" / "config.pbtxt", f"127.0.0.1:{grpc}")
    heavy = start_triton_module(heavy_repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
    router = start_triton_module(router_repo)
    return heavy, router


def test_split_output_equals_single_server(split, single_server_outputs, tokenizer):
    heavy, router = split
    before = model_stats(heavy.http_url, "heavy")["inference_count"]
    got = generate_all(router.grpc_url, tokenizer)
    for key, tokens in got.items():
        assert len(tokens) == MAX_TOKENS
        assert tokens == single_server_outputs[key], f"{key[1]} on {key[0]!r} differs from the single server"
    served = model_stats(heavy.http_url, "heavy")["inference_count"] - before
    assert served > 0, "the router did not use the heavy server"
    with pytest.raises(urllib.error.URLError):  # the router server really holds no heavy model
        model_stats(router.http_url, "heavy")


def test_heavy_server_refuses_direct_calls_while_router_uses_it(split, tokenizer):
    heavy, router = split
    op = BranchOp(77, 0, (3, 4, 5), draft_len=2)
    for transport, url in (("http", heavy.http_url), ("grpc", heavy.grpc_url)):
        for key in (None, "wrong-key-" * 3):
            tokens, error = branch_call(transport, url, "heavy", op, key=key)
            assert tokens is None and "heavy: refused" in error, (transport, key, error)
    tokens, _ = router_tokens(router.grpc_url, tokenizer.encode(PROMPTS[1]).ids, router_mode="heavy", max_tokens=4)
    assert len(tokens) == 4  # the router's remote calls carry the key


def test_router_with_another_key_is_refused_by_heavy(split, tiny_repository, tokenizer, tmp_path, monkeypatch):
    heavy, _ = split
    router_repo = copy_models(tiny_repository, tmp_path / "router_repo", ROUTER_MODELS)
    set_heavy_url(router_repo / "router" / "config.pbtxt", heavy.grpc_url)
    assert (router_repo / "router" / KEY_FILE).read_text() == (tiny_repository / "heavy" / KEY_FILE).read_text()
    monkeypatch.setenv(KEY_ENV, "another-deployment-key-0123")  # the router server's stubs inherit it
    with TritonServer(router_repo, log_path=tmp_path / "router.log", ready_timeout_s=120) as other:
        with pytest.raises(RuntimeError) as err:
            router_tokens(other.grpc_url, tokenizer.encode(PROMPTS[1]).ids, router_mode="heavy", max_tokens=4)
        log = other.log_text()
    assert "branch failure: the heavy branch failed" in str(err.value), err.value  # the client: whose fault
    assert "heavy: refused" in log and "does not match" in log  # the operator: why


def test_killed_heavy_fails_fast_and_router_recovers(split, single_server_outputs, tokenizer):
    heavy, router = split
    prompt = PROMPTS[0]
    ids = tokenizer.encode(prompt).ids
    crash(heavy)  # the whole process group, stubs included
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        router_tokens(router.grpc_url, ids, router_mode="verify", max_tokens=MAX_TOKENS)
    took = time.monotonic() - t0
    message = str(err.value)
    assert "branch failure: the heavy branch is unreachable" in message, message
    assert str(heavy.grpc_port) not in message, message  # the address is for the log only
    assert f"heavy branch (model 'heavy' at grpc://127.0.0.1:{heavy.grpc_port})" in router.log_text()
    assert took < FAIL_FAST_S, f"failing took {took:.1f} s"
    assert router.is_ready()
    light, _ = router_tokens(router.grpc_url, ids, router_mode="light", max_tokens=8)  # no heavy needed
    assert len(light) == 8

    heavy.start()  # same ports as before
    heavy.wait_ready(120)
    for mode in MODES:
        tokens, _ = router_tokens(router.grpc_url, ids, router_mode=mode, max_tokens=MAX_TOKENS)
        assert tokens == single_server_outputs[(prompt, mode)], f"{mode} after recovery differs"


def test_heavy_killed_under_load_fails_every_stream_by_name_then_recovers(split, single_server_outputs, tokenizer):
    heavy, router = split
    ids = [tokenizer.encode(p).ids for p in PROMPTS]
    streams = InFlight(router.grpc_url, ids, MODES, LONG_TOKENS, IN_FLIGHT)
    try:
        streams.wait_generating(60)
        t_kill = time.monotonic()
        crash(heavy)
        outcomes = streams.outcomes(FAIL_FAST_S + 20)
        took = [end - t_kill for end in streams.ended_at]
    finally:
        streams.close()
    for tokens, _, error in outcomes:
        assert tokens is None, f"a stream finished {len(tokens)} tokens without its heavy server"
        assert "branch failure: the heavy branch" in error and str(heavy.grpc_port) not in error, error
    assert max(took) < FAIL_FAST_S, f"streams failed {min(took):.2f}..{max(took):.2f} s after the kill"
    print(f"\n{IN_FLIGHT} streams in flight: errors {min(took):.2f}..{max(took):.2f} s after the kill")
    assert router.is_ready()
    assert len(router_tokens(router.grpc_url, ids[0], router_mode="light", max_tokens=8)[0]) == 8

    t_start = time.monotonic()
    heavy.start()  # same ports as before
    heavy.wait_ready(120)
    t_ready = time.monotonic()
    tokens, _ = router_tokens(router.grpc_url, ids[1], router_mode="verify", max_tokens=MAX_TOKENS)
    t_ok = time.monotonic()
    assert tokens == single_server_outputs[(PROMPTS[1], "verify")]
    print(f"restart: heavy ready {t_ready - t_start:.1f} s after start; first request done "
          f"{t_ok - t_ready:.2f} s after ready")
