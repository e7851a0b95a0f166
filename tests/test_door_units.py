"""The door's pieces without a tritonserver: `serve`'s limit option, the exposure warning, the
gRPC metadata filter, and the HTTP door against a stand-in upstream (aiohttp test server)."""
from __future__ import annotations

import argparse
import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tokenrouter_backend.cli import serve
from tokenrouter_backend.server import door_http
from tokenrouter_backend.server.door import DEFAULT_MAX_REQUEST_BYTES, Door
from tokenrouter_backend.server.door_grpc import forwarded_metadata
from tokenrouter_backend.server.exposure import AUGUST_2025_CVES, exposure_warning, is_loopback


def test_the_limit_option_takes_whole_bytes_in_range():
    assert serve._request_limit("8388608") == DEFAULT_MAX_REQUEST_BYTES
    for bad in ("0", "-1", "8MiB", str(2**31)):
        with pytest.raises(argparse.ArgumentTypeError):
            serve._request_limit(bad)
    with pytest.raises(ValueError, match="--max-request-bytes"):
        Door(address="127.0.0.1", http_port=1, grpc_port=2, upstream_http="", upstream_grpc="", max_request_bytes=0)


@pytest.mark.parametrize("address, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                               ("localhost", True), ("0.0.0.0", False), ("::", False),
                                               ("10.1.2.3", False), ("example.org", False)])
def test_loopback_is_told_from_everything_else(address, loopback):
    assert is_loopback(address) is loopback


def test_the_warning_names_every_cve_of_2_51_beyond_loopback_only():
    text = exposure_warning("0.0.0.0", "2.51.0", DEFAULT_MAX_REQUEST_BYTES)
    assert text.startswith("WARNING") and "2.51.0" in text and str(DEFAULT_MAX_REQUEST_BYTES) in text
    assert all(cve in text for cve in AUGUST_2025_CVES)
    assert "--no-door" in exposure_warning("0.0.0.0", "2.51.0", None)
    assert exposure_warning("0.0.0.0", None, None) is not None          # unknown version: warn
    assert exposure_warning("127.0.0.1", "2.51.0", None) is None
    assert exposure_warning("0.0.0.0", "2.59.1", None) is None


def test_serve_warns_on_stderr_and_in_the_log(tmp_path, monkeypatch, capsys):
    class Server:
        http_url = "http://127.0.0.1:1"
        log_path = tmp_path / "serve.log"

    monkeypatch.setattr(serve, "server_version", lambda url: "2.51.0")
    serve.warn_exposure(argparse.Namespace(address="0.0.0.0", no_door=False, max_request_bytes=1000), Server())
    err = capsys.readouterr().err
    assert "WARNING" in err and "CVE-2025-23310" in err
    assert "CVE-2025-23310" in Server.log_path.read_text()
    serve.warn_exposure(argparse.Namespace(address="127.0.0.1", no_door=False, max_request_bytes=1000), Server())
    assert capsys.readouterr().err == ""


def test_grpc_metadata_keeps_the_clients_own_keys_only():
    metadata = (("triton-grpc-protocol-tokenrouter-admin-key", "k"), ("user-agent", "grpc-python"),
                (":authority", "x"), ("grpc-accept-encoding", "gzip"), ("x-trace-bin", b"\x00"))
    assert forwarded_metadata(metadata) == (("triton-grpc-protocol-tokenrouter-admin-key", "k"),
                                            ("x-trace-bin", b"\x00"))


async def _through_door(limit: int, send):
    """``send(client)`` against the HTTP door in front of an upstream that echoes what it got."""
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"method": request.method, "path": request.path_qs, "length": len(body),
                                  "chunked": "chunked" in request.headers.get("Transfer-Encoding", ""),
                                  "key": request.headers.get("tokenrouter-admin-key")})

    upstream_app = web.Application()
    upstream_app.router.add_route("*", "/{tail:.*}", echo)
    async with TestServer(upstream_app) as upstream:
        app = door_http.create_app(str(upstream.make_url("")), limit)
        async with TestClient(TestServer(app)) as client:
            return await send(client)


def test_the_http_door_forwards_bodies_up_to_the_limit_with_a_length(monkeypatch):
    monkeypatch.setattr(door_http, "LINGER_S", 0.0)

    async def send(client):
        async def chunks():
            for _ in range(4):
                yield b"x" * 25
        at_limit = await client.post("/v2/models/m/infer?q=1", data=b"x" * 100, headers={"tokenrouter-admin-key": "k"})
        chunked = await client.post("/v2/x", data=chunks())
        over = await client.post("/v2/x", data=b"x" * 101)

        async def more():
            for _ in range(5):
                yield b"x" * 25
        chunked_over = await client.post("/v2/x", data=more())
        return (await at_limit.json(), await chunked.json(), over.status, await over.json(),
                chunked_over.status)

    at_limit, chunked, over_status, over, chunked_over = asyncio.run(_through_door(100, send))
    assert at_limit == {"method": "POST", "path": "/v2/models/m/infer?q=1", "length": 100, "chunked": False,
                        "key": "k"}
    assert chunked["length"] == 100 and chunked["chunked"] is False  # Triton never gets a chunked body
    assert over_status == 413 and "limit of 100 bytes" in over["error"] and "--max-request-bytes" in over["error"]
    assert chunked_over == 413
