"""The ASGI app: FastAPI routes onto the ensemble's gRPC stream.

``create_app(FrontConfig)`` loads the chat template once; the gRPC (asyncio) client and the
body parser's worker processes (``parsing.py``) live as long as the app (lifespan). Bodies
are read within ``max_body_bytes`` and streams at the client's pace (``transport.py``); the
body is parsed and validated in a worker process and the chat template renders in a bounded
worker thread, so the event loop only moves bytes. Streams are answered with HTTP 200 only
once the first response arrived, so a refused request gets its HTTP status; later errors
become one ``data: {"error": ...}`` event before ``data: [DONE]``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from .chat_template import ChatTemplate
from .logprobs import TokenText, chat_logprobs, completion_logprobs, next_offset
from .errors import OpenAIError, not_found, server_error, unavailable
from .parsing import BodyParser, Limits
from .protocol import GenerationBody
from .responses import DONE, PUBLIC_MODEL, Endpoint, Reply, model_card, models_list, sse
from .transport import BodyLimit, StalledStream
from .triton_stream import Piece, generate

LOG = logging.getLogger("tokenrouter.openai_front")
CLIENT_GONE_STATUS = 499  # nobody reads it: the client closed the connection


@dataclass(frozen=True)
class FrontConfig:
    triton_grpc_url: str  # host:port of the server holding the ensemble
    tokenizer_dir: Optional[Path] = None  # the exported tokenizer (its chat template); None = no chat
    chat_template_file: Optional[Path] = None  # a Jinja chat template replacing the tokenizer's
    request_timeout_s: float = 600.0  # one answer, start to end
    disconnect_poll_s: float = 0.2  # how often a non-streamed request checks its client is still there
    chat_special_tokens: bool = False  # special-token text in chat content parsed as control tokens (unsafe)
    stream_stall_s: float = 30.0  # a streamed event the client has not taken by then ends its stream
    stream_buffer_bytes: int = 64 * 1024  # a connection's write buffer, and its socket's (runner.py)
    limits: Limits = Limits()  # body and prompt sizes, parser processes (parsing.py)


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


def create_app(config: FrontConfig) -> FastAPI:
    chat = ChatTemplate(config.tokenizer_dir, config.chat_template_file) if config.tokenizer_dir else None
    words = TokenText(chat.tokenizer) if chat is not None else None  # the tokens' text in logprobs
    started = int(time.time())
    parser = BodyParser(config.limits)
    renderers = anyio.CapacityLimiter(config.limits.parse_workers)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        import tritonclient.grpc.aio as grpcclient

        from tokenrouter_backend.client.grpc_channel import reconnecting_channel_args

        # reconnects within a second once a restarted server is back (`serve --restarts`)
        app.state.triton = grpcclient.InferenceServerClient(config.triton_grpc_url,
                                                            channel_args=reconnecting_channel_args())
        try:
            await parser.start()
            yield
        finally:
            await app.state.triton.close()
            await anyio.to_thread.run_sync(parser.close)

    app = FastAPI(title="TokenRouter (OpenAI-compatible)", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_body_bytes=config.limits.max_body_bytes)
    app.add_exception_handler(OpenAIError, lambda _r, exc: JSONResponse(exc.body(), status_code=exc.status,
                                                                        headers=exc.headers()))
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)  # a bug: still OpenAI's JSON shape, never plain text

    @app.get("/v1/models")
    async def list_models():
        return models_list(started)

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id != PUBLIC_MODEL:
            raise not_found(f"The model '{model_id}' does not exist", "model_not_found")
        return model_card(started)

    @app.get("/health")
    async def health():
        try:
            ready = await app.state.triton.is_server_ready()
        except Exception as exc:  # noqa: BLE001 - any failure to ask means not ready
            LOG.warning("health: the inference server is not reachable: %s", exc)  # its address: log only
            raise unavailable("the inference server is not reachable") from exc
        if not ready:
            raise unavailable("the inference server is not ready")
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parser.parse("completion", await request.body())
        _check_model(body)
        prefix = body.prompt_text() if body.echo else ""
        scores = _scores(body, words, Endpoint.COMPLETION)
        return await _answer(app, config, request, Reply(Endpoint.COMPLETION), body, body.prompt_text(), prefix,
                             scores=scores)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parser.parse("chat", await request.body())
        _check_model(body)
        if chat is None:
            raise OpenAIError("this front was started without the exported tokenizer: no chat template",
                              param="messages", code="chat_template_missing")
        messages = body.template_messages()
        if config.chat_special_tokens:  # the old behaviour: content's special-token text is control tokens
            prompt, spans = await anyio.to_thread.run_sync(chat.render, messages, limiter=renderers), None
        else:
            prompt, spans = await anyio.to_thread.run_sync(chat.render_with_spans, messages, limiter=renderers)
        return await _answer(app, config, request, Reply(Endpoint.CHAT), body, prompt, "", spans,
                             _scores(body, words, Endpoint.CHAT))

    return app


@dataclass
class Scores:
    """How a request's answer tokens' log-probabilities become OpenAI's ``logprobs``."""

    endpoint: Endpoint
    words: TokenText
    top: int
    offset: int = 0  # completions: the text offset of the next token

    def of(self, entries: list) -> dict:
        if self.endpoint is Endpoint.CHAT:
            return chat_logprobs(entries, self.words, self.top)
        out = completion_logprobs(entries, self.words, self.top, self.offset)
        self.offset = next_offset(out) or self.offset
        return out


def _scores(body: GenerationBody, words: Optional[TokenText], endpoint: Endpoint) -> Optional[Scores]:
    """The request's ``Scores``, None when it asked for no log-probabilities."""
    top = body.logprob_count()
    if top < 0:
        return None
    if words is None:
        raise OpenAIError("logprobs needs the served tokenizer: this front was started without the exported "
                          "tokenizer", param="logprobs")
    return Scores(endpoint, words, top)


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    LOG.error("unexpected error in the OpenAI front", exc_info=exc)
    return JSONResponse(server_error(f"internal error in the OpenAI front ({type(exc).__name__})").body(),
                        status_code=500)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    kind = "not_found" if exc.status_code == 404 else None
    return JSONResponse(OpenAIError(str(exc.detail), status=exc.status_code, code=kind).body(),
                        status_code=exc.status_code)


def _check_model(body: GenerationBody) -> None:
    if body.model != PUBLIC_MODEL:
        raise not_found(f"The model '{body.model}' does not exist (this server serves '{PUBLIC_MODEL}')",
                        "model_not_found")


async def _answer(app: FastAPI, config: FrontConfig, request: Request, reply: Reply, body: GenerationBody,
                  prompt: str, prefix: str, content_spans: Optional[list[int]] = None,
                  scores: Optional[Scores] = None) -> Response:
    pieces = generate(app.state.triton, prompt, body.stream, body.knobs(), reply.id, config.request_timeout_s,
                      content_spans)
    try:
        if not body.stream:
            text, stats, entries = await _until_disconnected(request, _collect(pieces), config.disconnect_poll_s)
            return JSONResponse(reply.body(prefix + text, stats, scores.of(entries) if scores else None))
        first = await _until_disconnected(request, anext(pieces, None), config.disconnect_poll_s)
    except ClientGone:
        await pieces.aclose()
        return Response(status_code=CLIENT_GONE_STATUS)
    except OpenAIError:
        await pieces.aclose()
        raise
    if first is None:
        raise server_error("the server ended the stream without an answer")
    return StalledStream(_events(reply, body, first, pieces, prefix, scores), config.stream_stall_s)


async def _collect(pieces) -> tuple[str, dict, list]:
    """The answer's text, its last stats, and its tokens' scores (the prompt's first when asked)."""
    text, stats, entries = [], {}, []
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            text.append(piece.text)
            stats = piece.stats
            entries += piece.prompt_logprobs + piece.logprobs
    return "".join(text), stats, entries


async def _events(reply: Reply, body: GenerationBody, first: Piece, pieces, prefix: str,
                  scores: Optional[Scores] = None):
    """SSE events; a disconnect or a stalled client closes this generator, and closing ``pieces``
    cancels the generation. With ``scores``, a chunk's logprobs are those of the tokens that
    came with its text (a response whose tokens end in part of a character has no text yet:
    its tokens' logprobs wait for the next chunk)."""
    async with contextlib.aclosing(pieces):
        stats, held = first.stats, first.prompt_logprobs + first.logprobs
        opening = prefix + first.text
        yield reply.chunk(opening, first=True, logprobs=scores.of(held) if scores and (opening or not held) else None)
        if opening or not scores:
            held = []
        try:
            async for piece in pieces:
                stats = piece.stats
                held += piece.logprobs
                if piece.text:
                    yield reply.chunk(piece.text, logprobs=scores.of(held) if scores else None)
                    held = []
        except OpenAIError as err:
            yield sse(err.body())
            yield DONE
            return
        yield reply.chunk("", stats, logprobs=scores.of(held) if scores and held else None)
        if body.include_usage:
            yield reply.usage_chunk(stats)
        yield DONE


async def _until_disconnected(request: Request, awaitable, poll_s: float):
    """Await ``awaitable``; cancel it and raise ``ClientGone`` when the client disconnects."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            gone = await request.is_disconnected()
            if gone:
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
