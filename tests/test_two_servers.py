"""Two real tritonservers on loopback: a heavy server (only ``heavy``) and a router server
(router, light, pre/post-processing, ensemble) whose router reaches heavy over gRPC through
its ``heavy_url`` parameter. Output must equal the single-server setup token for token;
a killed heavy server must fail requests quickly with an error naming the heavy branch and
URL while the router stays up, and the router must recover when heavy returns on its port.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
import urllib.error
from pathlib import Path

import pytest

from support.branch_calls import branch_call
from support.serving_helpers import model_stats, router_tokens
from tokenrouter_backend.core.branch_auth import KEY_ENV, KEY_FILE
from tokenrouter_backend.core.branch_protocol import BranchOp
from tokenrouter_backend.server.ports import free_ports
from tokenrouter_backend.server.process import TritonServer

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n",
           "for i in range(10):\n    ", "def add(a, b):\n    return", "raise ValueError("]
MODES = ("heavy", "verify")
MAX_TOKENS = 24
FAIL_FAST_S = 10.0  # RemoteBranch: 4 attempts, backoff 0.25 + 0.5 + 1 s; refused connects are instant
ROUTER_MODELS = ("router", "light", "preprocessing", "postprocessing", "tokenrouter")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def copy_models(src: Path, dst: Path, models) -> Path:
    for name in models:
        shutil.copytree(src / name, dst / name, ignore=IGNORE)
    return dst


def set_heavy_url(router_config: Path, url: str) -> None:
    text = router_config.read_text()
    new, n = re.subn(r'(key: "heavy_url" value: \{ string_value: )""', rf'\1"{url}"', text)
    assert n == 1, "router config lacks the heavy_url parameter"
    router_config.write_text(new)


@pytest.fixture(scope="module")
def tokenizer(tiny_repository):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_repository / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def generate_all(grpc_url: str, tokenizer) -> dict:
    return {(p, m): router_tokens(grpc_url, tokenizer.encode(p).ids, router_mode=m, max_tokens=MAX_TOKENS)[0]
            for p in PROMPTS for m in MODES}


@pytest.fixture(scope="module")
def single_server_outputs(tiny_repository, tokenizer, tmp_path_factory):
    """Reference: the tiny repository served alone (stopped before the split servers start)."""
    server = TritonServer(tiny_repository, log_path=tmp_path_factory.mktemp("single") / "triton.log")
    try:
        server.start()
        server.wait_ready(120)
        return generate_all(server.grpc_url, tokenizer)
    finally:
        server.stop()


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
    assert "heavy: refused" in str(err.value) and "does not match" in str(err.value)


def test_killed_heavy_fails_fast_and_router_recovers(split, single_server_outputs, tokenizer):
    heavy, router = split
    prompt = PROMPTS[0]
    ids = tokenizer.encode(prompt).ids
    os.killpg(heavy.pid, signal.SIGKILL)  # the whole process group, stubs included: a crash
    heavy.stop()  # reaps it; nothing left to signal
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        router_tokens(router.grpc_url, ids, router_mode="verify", max_tokens=MAX_TOKENS)
    took = time.monotonic() - t0
    message = str(err.value)
    assert f"heavy branch (model 'heavy' at grpc://127.0.0.1:{heavy.grpc_port})" in message, message
    assert "unreachable" in message, message
    assert took < FAIL_FAST_S, f"failing took {took:.1f} s"
    assert router.is_ready()
    light, _ = router_tokens(router.grpc_url, ids, router_mode="light", max_tokens=8)  # no heavy needed
    assert len(light) == 8

    heavy.start()  # same ports as before
    heavy.wait_ready(120)
    for mode in MODES:
        tokens, _ = router_tokens(router.grpc_url, ids, router_mode=mode, max_tokens=MAX_TOKENS)
        assert tokens == single_server_outputs[(prompt, mode)], f"{mode} after recovery differs"
