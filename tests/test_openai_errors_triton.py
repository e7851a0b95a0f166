"""Errors that say whose fault they are, end to end: real tritonservers, the router's real
messages, the OpenAI front's HTTP status, error type and headers.

Two heavy servers, a router server whose ``heavy_url`` is the first (admission: one live
request, none queued) and a router server whose heavy pool is both; each router server with
its own OpenAI front. A wrong field is 400 naming it; a full server 429 with Retry-After (and
what Triton's own /generate answers then); a remote heavy server down, a heavy pool down and
an in-server branch stub killed are 502 ``branch_failed``, and no body carries an address or
port (the router's log does).
"""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
import requests

from support.split_setup import ROUTER_MODELS, copy_models, crash, set_heavy_url
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront
from tokenrouter_backend.server.ports import free_ports

pytestmark = pytest.mark.triton  # every test here talks to real tritonservers

PROMPT = "def fibonacci(n):\n    "
ANSWER_BOUND_S = 60.0
ADDRESS = re.compile(r"127\.0\.0\.1|localhost|grpc://|\b\d{4,5}\b")


def set_parameter(config, key: str, value: str) -> None:
    text = config.read_text()
    new, n = re.subn(rf'(key: "{key}" value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', text)
    assert n == 1, f"router config lacks {key}"
    config.write_text(new)


@pytest.fixture(scope="module")
def servers(tiny_repository, start_triton_module, tmp_path_factory):
    """{"heavy_a", "heavy_b", "single", "pool"}: the heavy servers on fixed ports; "single"'s router
    reaches heavy_a (one live request, none queued), "pool"'s router both."""
    root = tmp_path_factory.mktemp("errors")
    heavies = []
    for name in ("a", "b"):
        repo = copy_models(tiny_repository, root / f"heavy_{name}", ["heavy"])
        http, grpc, metrics = free_ports(3)
        heavies.append(start_triton_module(repo, http_port=http, grpc_port=grpc, metrics_port=metrics))
    urls = [f"127.0.0.1:{h.grpc_port}" for h in heavies]
    single = copy_models(tiny_repository, root / "single", ROUTER_MODELS)
    set_heavy_url(single / "router" / "config.pbtxt", urls[0])
    set_parameter(single / "router" / "config.pbtxt", "max_live_requests", "1")
    set_parameter(single / "router" / "config.pbtxt", "max_queued_requests", "0")
    pool = copy_models(tiny_repository, root / "pool", ROUTER_MODELS)
    set_heavy_url(pool / "router" / "config.pbtxt", ",".join(urls))
    return {"heavy_a": heavies[0], "heavy_b": heavies[1], "single": start_triton_module(single),
            "pool": start_triton_module(pool)}


@pytest.fixture(scope="module")
def fronts(servers, tiny_repository):
    started = {}
    try:
        for name in ("single", "pool"):
            config = FrontConfig(servers[name].grpc_url, tiny_repository / TOKENIZER_DIR)
            started[name] = OpenAIFront(config, port=0).start()
        yield {name: front.url for name, front in started.items()}
    finally:
        for front in started.values():
            front.stop()


def complete(url: str, stream: bool = False, **fields) -> requests.Response:
    body = {"model": "tokenrouter", "prompt": PROMPT, "max_tokens": 8, "stream": stream, **fields}
    return requests.post(f"{url}/completions", json=body, timeout=ANSWER_BOUND_S)


def error_of(resp: requests.Response, status: int) -> dict:
    """The OpenAI-shaped error of ``resp``, which must have ``status`` and no address in its body."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    assert not ADDRESS.search(resp.text), resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_wrong_field_is_400_naming_it(fronts):
    error = error_of(complete(fronts["single"], confidence_threshold=5), 400)  # refused by the router
    assert (error["type"], error["param"]) == ("invalid_request_error", "confidence_threshold"), error
    assert error["message"].startswith("confidence_threshold must be"), error


def test_a_full_server_is_429_with_retry_after(fronts, servers):
    """One request holds the only admission place: the next is refused busy, at once."""
    holding = requests.post(f"{fronts['single']}/completions", stream=True, timeout=ANSWER_BOUND_S, json={
        "model": "tokenrouter", "prompt": PROMPT, "max_tokens": 1000, "stream": True, "router_mode": "heavy"})
    try:
        assert holding.status_code == 200, holding.text
        lines = holding.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: {")  # generating: it holds the place
        resp = complete(fronts["single"])
        error = error_of(resp, 429)
        assert (error["type"], error["code"]) == ("server_error", "server_busy"), error
        assert error["message"].startswith("server busy:"), error
        assert int(resp.headers["Retry-After"]) >= 1
        # Triton's own generate endpoint: tritonserver 2.51 answers every error of /generate with
        # 400, whatever the code (research/studies/triton_error_codes.py); the category is the
        # message's prefix, as documented (docs/security.md, "Errors")
        direct = requests.post(f"{servers['single'].http_url}/v2/models/tokenrouter/generate",
                               json={"text_input": PROMPT, "max_tokens": 4}, timeout=ANSWER_BOUND_S)
        assert direct.status_code in (400, 503), direct.text  # 503 once Triton keeps the UNAVAILABLE code
        assert direct.json()["error"] == "in ensemble 'tokenrouter', " + error["message"], direct.text
    finally:
        holding.close()  # the front cancels the router's stream: the place is free again
    deadline = time.monotonic() + ANSWER_BOUND_S
    while complete(fronts["single"], router_mode="light").status_code == 429:  # until the router saw it
        assert time.monotonic() < deadline, "the cancelled request kept its admission place"
        time.sleep(0.2)


def wait_for_502(url: str, **fields) -> requests.Response:
    """A failing branch may need a moment to be seen failing (a remote server's reset)."""
    deadline = time.monotonic() + ANSWER_BOUND_S
    while True:
        resp = complete(url, **fields)
        if resp.status_code != 200 or time.monotonic() > deadline:
            return resp
        time.sleep(0.5)


def test_a_remote_heavy_server_down_is_502_without_its_address(fronts, servers):
    heavy = servers["heavy_a"]
    crash(heavy)
    for stream in (False, True):  # a stream refused before its first piece gets its HTTP status too
        error = error_of(wait_for_502(fronts["single"], stream=stream, router_mode="heavy"), 502)
        assert (error["type"], error["code"]) == ("server_error", "branch_failed"), error
        assert error["message"] == "branch failure: the heavy branch is unreachable (the server log has the detail)"
    assert f"127.0.0.1:{heavy.grpc_port}" in servers["single"].log_text()  # the operator gets the address
    light = complete(fronts["single"], router_mode="light")
    assert light.status_code == 200, light.text  # the router itself keeps serving


def test_a_heavy_pool_down_is_502_without_addresses(fronts, servers):
    assert complete(fronts["pool"], router_mode="heavy").status_code == 200  # one member left serves
    crash(servers["heavy_b"])  # heavy_a is down already (test order) or now
    if servers["heavy_a"].is_running():
        crash(servers["heavy_a"])
    error = error_of(wait_for_502(fronts["pool"], router_mode="heavy"), 502)
    assert (error["type"], error["code"]) == ("server_error", "branch_failed"), error
    assert "the heavy branch" in error["message"], error
    assert f"127.0.0.1:{servers['heavy_b'].grpc_port}" in servers["pool"].log_text()


def test_an_in_server_branch_stub_killed_is_502(fronts, servers):
    from tokenrouter_backend.server.pids import stub_model

    router = servers["single"]
    victim = next(pid for pid in router.group_pids() if stub_model(pid) == "light")
    os.kill(victim, signal.SIGKILL)
    resp = wait_for_502(fronts["single"], router_mode="light")
    if not router.is_running():  # tritonserver 2.51's known stub-mutex abort (tests/test_faults.py)
        assert "boost::interprocess::lock_exception" in router.log_text()
        error_of(resp, 503)  # the front cannot reach it: unavailable, still without an address
        return
    error = error_of(resp, 502)
    assert (error["type"], error["code"]) == ("server_error", "branch_failed"), error
    assert error["message"].startswith("branch failure: the light branch "), error


def test_unknown_failures_are_json_never_plain_text(fronts):
    resp = requests.post(f"{fronts['single']}/completions", data=b"[" * 100_000, timeout=ANSWER_BOUND_S,
                         headers={"content-type": "application/json"})
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:200]
    assert resp.json()["error"]["type"] in ("invalid_request_error", "server_error")

