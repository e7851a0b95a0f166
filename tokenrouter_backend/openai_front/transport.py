"""The front at the HTTP level: request bodies within a size, streams within a client's pace.

``BodyLimit`` refuses a body above ``max_body_bytes`` with 413 ``content_too_large`` (the
status, type and code of Triton's own OpenAI front) before it is buffered: a declared
Content-Length is judged before anything is read, a chunked body is counted as it arrives and
refused at the chunk that crosses the limit. (FastAPI's ``max_body_size`` answers a declared
size in plain text, not in OpenAI's shape.)

``StalledStream`` is the SSE response. Its events are produced only as fast as the client
takes them: uvicorn pauses a send while the connection's write buffer is above its high-water
mark, and the runner sets that mark and the socket's send buffer to ``stream_buffer_bytes``
(64 KiB; ``runner.py``), so the front holds at most about twice that per stream, never a
backlog. A send the client has not taken within ``stall_s`` (``stream_stall_s``, 30 s) ends
the stream: the generation is cancelled (the router's stream closes, its KV sessions are
freed) and the response is left incomplete, so uvicorn logs "ASGI callable returned without
completing response" and closes the connection. Other streams are separate tasks and never
wait for it. (An answer smaller than the buffers, as most are, is simply buffered whole.)
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi.responses import JSONResponse, StreamingResponse

from .errors import OpenAIError

log = logging.getLogger(__name__)


class BodyLimit:
    """ASGI middleware: a request body above ``max_body_bytes`` is answered 413 (see the module)."""

    def __init__(self, app, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _refusal(self) -> OpenAIError:
        return OpenAIError(f"the request body is larger than {self.max_body_bytes} bytes (the front's "
                           "max_body_bytes)", status=413, code="content_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            error = self._refusal()
            return await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise self._refusal()  # out of request.body(): the OpenAIError handler answers it
            return message

        await self.app(scope, counted, send)


class StalledStream(StreamingResponse):
    """An SSE response that gives up on a client which stops taking its events (see the module)."""

    media_type = "text/event-stream"

    def __init__(self, events, stall_s: float):
        super().__init__(events)
        self.stall_s = stall_s

    async def stream_response(self, send) -> None:
        async with contextlib.aclosing(self.body_iterator):  # closed on a stall, a disconnect or the end
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for event in self.body_iterator:
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": event.encode(),
                                                 "more_body": True}), self.stall_s)
                except TimeoutError:
                    log.warning("a streaming client took no event for %g s: its generation is cancelled",
                                self.stall_s)
                    return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
