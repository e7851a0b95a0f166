"""The door's HTTP side: a size-limiting reverse proxy (aiohttp) in front of tritonserver's HTTP port.

A request whose ``Content-Length`` exceeds the limit is answered ``413`` from its headers,
before a byte of its body is read; a chunked (or compressed) body is counted while it is
read — decompressed bytes, aiohttp decodes ``Content-Encoding`` in bounded steps — and cut
with ``413`` once it passes the limit. An accepted body goes to tritonserver in one piece
with a ``Content-Length`` (never chunked: Triton 2.51's chunked parser is CVE-2025-23310/
23311), so the largest body Triton ever receives is the limit. Everything else passes
through: method, path and query, headers (the admin key among them), status, response
headers and the response body, streamed unbuffered chunk by chunk (``generate_stream``'s
server-sent events). tritonserver not answering (a restart) is a ``502`` in Triton's own
``{"error": ...}`` shape.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from yarl import URL

LIMIT_FLAG = "--max-request-bytes"
# after a 413 the connection stays open this long, unread (aiohttp stops reading once its small
# buffer is full, so this costs no CPU), before it closes: a client still sending its body
# reads the answer instead of a connection reset
LINGER_S = 1.0
CONNECT_TIMEOUT_S = 10.0
# hop-by-hop headers (RFC 9110 7.6.1) and the ones the door sets itself
REQUEST_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                             "transfer-encoding", "upgrade", "host", "content-length",
                             "content-encoding", "expect"})
RESPONSE_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                              "transfer-encoding", "upgrade", "content-length"})
LIMIT_KEY = web.AppKey("limit", int)
UPSTREAM_KEY = web.AppKey("upstream", str)
SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


class BodyTooLarge(Exception):
    """The request body passed the door's limit."""


async def too_large(request: web.Request, limit: int, what: str) -> web.Response:
    """413 in Triton's error shape, naming the limit and the option that sets it; sent at once,
    then the connection is held (unread) for LINGER_S and closed."""
    response = web.json_response(
        {"error": f"request body {what} exceeds the limit of {limit} bytes "
                  f"(tokenrouter serve {LIMIT_FLAG})"},
        status=413, headers={"Connection": "close"})
    await response.prepare(request)
    await response.write_eof()
    await asyncio.sleep(LINGER_S)
    return response


async def read_body(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body, or `BodyTooLarge` as soon as more than ``limit`` bytes arrived."""
    body = bytearray()
    async for chunk in content.iter_any():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(len(body))
    return bytes(body)


def _kept(headers, dropped: frozenset[str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k.lower() not in dropped]


async def forward(request: web.Request) -> web.StreamResponse:
    limit = request.app[LIMIT_KEY]
    declared = request.content_length
    if declared is not None and declared > limit:
        return await too_large(request, limit, f"of {declared} bytes (Content-Length)")
    try:
        body = await read_body(request.content, limit)
    except BodyTooLarge:
        return await too_large(request, limit, "(chunked or compressed, counted while read)")
    url = URL(request.app[UPSTREAM_KEY] + request.raw_path, encoded=True)
    headers = _kept(request.headers, REQUEST_DROPPED)
    try:
        upstream = await request.app[SESSION_KEY].request(
            request.method, url, headers=headers, data=body if body or request.body_exists else None,
            allow_redirects=False)
    except (aiohttp.ClientError, OSError) as err:
        return web.json_response({"error": f"tritonserver is not answering ({type(err).__name__}); "
                                           "retry shortly"}, status=502)
    async with upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=_kept(upstream.headers, RESPONSE_DROPPED))
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, ConnectionError):
            # tritonserver went away mid-answer, or the client did: end this connection
            request.transport and request.transport.close()
            return response
        await response.write_eof()
    return response


async def _session(app: web.Application):
    app[SESSION_KEY] = aiohttp.ClientSession(
        auto_decompress=False,  # compressed answers pass through as Triton sent them
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
        connector=aiohttp.TCPConnector(limit=0),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
    yield
    await app[SESSION_KEY].close()


def create_app(upstream_url: str, limit: int) -> web.Application:
    """The door's HTTP application: every method and path forwarded to ``upstream_url``."""
    app = web.Application()
    app[LIMIT_KEY] = limit
    app[UPSTREAM_KEY] = upstream_url.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app
