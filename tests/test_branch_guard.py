"""Branch models answer only the router: direct calls to ``heavy``/``light`` over HTTP and
gRPC are refused (no key, wrong key), while the ensemble keeps serving (real tritonserver);
the launcher's default admin restriction holds on the same server."""
from __future__ import annotations

import pytest

from support.branch_calls import branch_call
from support.serving_helpers import model_stats
from tokenrouter_backend.client.triton_client import generate_grpc, generate_http
from tokenrouter_backend.core.protocol.branch_auth import KEY_FILE, KEY_PARAMETER
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

OP = BranchOp(4242, 0, (3, 4, 5), draft_len=2)


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


def _url(server, transport):
    return server.http_url if transport == "http" else server.grpc_url


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("model", ["heavy", "light"])
def test_direct_branch_calls_are_refused(server, transport, model):
    before = model_stats(server.http_url, model)["inference_count"]
    for key, problem in ((None, "is missing"), ("not-the-key-" * 3, "does not match")):
        tokens, error = branch_call(transport, _url(server, transport), model, OP, key=key)
        assert tokens is None, f"{model} over {transport} answered a request without the key"
        assert f"{model}: refused: branch models answer only the TokenRouter router" in error
        assert f"'{KEY_PARAMETER}' {problem}" in error, error
    key = (server.repository / model / KEY_FILE).read_text().strip()
    assert key not in server.log_text()  # the key is never logged
    # Triton counts refused requests as executed; what matters is no session was created:
    tokens, error = branch_call(transport, _url(server, transport), model,
                                BranchOp(OP.session_id, 3, (6,)), key=key)
    assert error is not None and "session 4242 does not exist" in error, error
    assert model_stats(server.http_url, model)["inference_count"] >= before


def test_admin_api_needs_the_key_while_the_ensemble_serves(server):
    import urllib.error
    import urllib.request

    url = f"{server.http_url}/v2/models/tokenrouter/config"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 403
    with urllib.request.urlopen(urllib.request.Request(url, headers=server.admin_headers), timeout=10) as r:
        assert r.status == 200
    result = generate_http(server.http_url.removeprefix("http://"), "import os\n", max_tokens=4)
    assert result.tokens == 4


def test_ensemble_keeps_serving_and_the_key_opens_a_branch(server):
    for generate in (generate_http, generate_grpc):
        url = server.http_url.removeprefix("http://") if generate is generate_http else server.grpc_url
        result = generate(url, "def add(a, b):\n    return", router_mode="verify", max_tokens=8)
        assert result.tokens == 8
    key = (server.repository / "heavy" / KEY_FILE).read_text().strip()
    tokens, error = branch_call("grpc", server.grpc_url, "heavy", BranchOp(7, 0, (3, 4, 5), draft_len=2), key=key)
    assert error is None and len(tokens) == 3 + 2 - 1
    tokens, error = branch_call("http", server.http_url, "heavy", BranchOp(7, 0, (), release=True), key=key)
    assert error is None
