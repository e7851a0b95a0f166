"""The ASGI app: FastAPI routes onto the ensemble's gRPC stream.

``create_app(FrontConfig)`` loads the chat template once; the gRPC (asyncio) client and the
body parser's worker processes (``parsing.py``) live as long as the app (lifespan). Bodies
are read within ``max_body_bytes`` and streams at the client's pace (``transport.py``); the
body is parsed and validated in a worker process and the chat template renders in a bounded
worker thread, so the event loop only moves bytes. Streams are answered with HTTP 200 only
once the first response arrived (of every prompt, for a completion with several), so a
refused request gets its HTTP status; later errors become one ``data: {"error": ...}`` event
before ``data: [DONE]``. Each prompt of a completion is a generation of its own, all at once
(``fanout.py``). ``/tokenize`` and ``/detokenize`` (vLLM's) ask the served models
(``served_tokenizer.py``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from .chat_template import ChatTemplate
from .errors import OpenAIError, not_found, server_error, unavailable
from .fanout import Fanout
from .logprobs import TokenText, chat_logprobs, completion_logprobs, next_offset
from .parsing import Body, BodyParser, Limits
from .protocol import GenerationBody, Prompt, TokenizeChatBody
from .responses import DONE, PUBLIC_MODEL, Endpoint, Reply, model_card, models_list, sse
from .served_tokenizer import repository_max_context, text_of, token_ids
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
    max_model_len = repository_max_context(config.tokenizer_dir)

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
        scores = _scores(body, words, Endpoint.COMPLETION)
        return await _answer(app, config, request, Reply(Endpoint.COMPLETION), body, body.prompts(), body.echo,
                             scores=scores)

    async def render(messages: list[dict[str, str]], generation_prompt: bool = True):
        """The chat prompt and its contents' spans (None: special-token text is control tokens)."""
        if chat is None:
            raise OpenAIError("this front was started without the exported tokenizer: no chat template",
                              param="messages", code="chat_template_missing")
        if config.chat_special_tokens:  # the old behaviour: content's special-token text is control tokens
            return await anyio.to_thread.run_sync(chat.render, messages, generation_prompt, limiter=renderers), None
        return await anyio.to_thread.run_sync(chat.render_with_spans, messages, generation_prompt,
                                              limiter=renderers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parser.parse("chat", await request.body())
        _check_model(body)
        prompt, spans = await render(body.template_messages())
        return await _answer(app, config, request, Reply(Endpoint.CHAT), body, [prompt], False, spans,
                             _scores(body, words, Endpoint.CHAT))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's: a prompt, or chat messages as the chat endpoint renders them, as generation's ids."""
        body = await parser.parse("tokenize", await request.body())
        _check_model(body)
        if isinstance(body, TokenizeChatBody):
            (text, spans), param = await render(body.template_messages(), body.add_generation_prompt), "messages"
        else:
            text, spans, param = body.prompt, None, "prompt"
        ids = await token_ids(app.state.triton, text, body.add_special_tokens, config.request_timeout_s, param, spans)
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's: token ids as the text an answer made of them shows."""
        body = await parser.parse("detokenize", await request.body())
        _check_model(body)
        return {"prompt": await text_of(app.state.triton, body.tokens, config.request_timeout_s, "tokens")}

    return app


@dataclass
class Scores:
    """How one request's tokens' log-probabilities become OpenAI's ``logprobs`` (per choice)."""

    endpoint: Endpoint
    words: TokenText
    top: int
    offsets: dict = field(default_factory=dict)  # completions: each choice's text offset of its next token

    def of(self, entries: list, index: int = 0) -> dict:
        if self.endpoint is Endpoint.CHAT:
            return chat_logprobs(entries, self.words, self.top)
        out = completion_logprobs(entries, self.words, self.top, self.offsets.get(index, 0))
        self.offsets[index] = next_offset(out) or self.offsets.get(index, 0)
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


def _check_model(body: Body) -> None:
    optional = not isinstance(body, GenerationBody)  # vLLM's tokenizer bodies may leave `model` out
    if body.model != PUBLIC_MODEL and not (optional and body.model is None):
        raise not_found(f"The model '{body.model}' does not exist (this server serves '{PUBLIC_MODEL}')",
                        "model_not_found")


async def _answer(app: FastAPI, config: FrontConfig, request: Request, reply: Reply, body: GenerationBody,
                  prompts: Sequence[Prompt], echo: bool, content_spans: Optional[list[int]] = None,
                  scores: Optional[Scores] = None) -> Response:
    """Every prompt's ``n`` (or ``best_of``) generations at once, choices in the prompts' order
    (prompt i's choice j has index i·n + j)."""
    n, k = body.choices(), body.candidates()
    if len(prompts) * k > config.limits.max_prompts:
        field = "best_of" if k > n else "n"
        raise OpenAIError(f"{len(prompts)} prompt(s) x {field} {k} = {len(prompts) * k} generations; at most "
                          f"{config.limits.max_prompts} allowed", param=field)
    fanout = Fanout(_generations(app, config, reply, body, prompts, content_spans))
    streaming = False
    try:
        if not body.stream:
            generated = await _until_disconnected(request, fanout.collect(), config.disconnect_poll_s)
            answers = [best for i in range(len(prompts)) for best in _best(generated[i * k:(i + 1) * k], n)]
            prefixes = [p for p in await _echoes(app, config, prompts, echo) for _ in range(n)]
            logprobs = [scores.of(entries, i) for i, (_, _, entries) in enumerate(answers)] if scores else None
            return JSONResponse(reply.batch_body([(p + text, stats) for p, (text, stats, _) in zip(prefixes, answers)],
                                                 logprobs, [stats for _, stats, _ in generated]))
        firsts = await _until_disconnected(request, fanout.started(), config.disconnect_poll_s)
        if any(first is None for first in firsts):
            raise server_error("the server ended the stream without an answer")
        prefixes = [p for p in await _echoes(app, config, prompts, echo) for _ in range(n)]
        streaming = True
        return StalledStream(_events(reply, body, firsts, fanout, prefixes, scores), config.stream_stall_s)
    except ClientGone:
        return Response(status_code=CLIENT_GONE_STATUS)
    finally:
        if not streaming:
            await fanout.aclose()


def _generations(app: FastAPI, config: FrontConfig, reply: Reply, body: GenerationBody, prompts: Sequence[Prompt],
                 content_spans: Optional[list[int]]) -> list:
    """Each prompt's generations, in order. Generation j of a prompt runs with seed
    ``body.seed_of(j)``; with several, the first is streamed from the router and the others
    start once it has answered twice (its session has opened again, which puts the prompt's
    full KV blocks in each branch's prefix cache), so the prompt is prefilled once per branch
    and the others read it (``heavy_reused_tokens`` / ``light_reused_tokens``). ``best_of``
    beyond ``n`` asks for log-probabilities to rank them (``_best``)."""
    k = body.candidates()
    knobs = body.knobs()
    if k > body.choices() and "return_log_probs" not in knobs:
        knobs.update(return_log_probs=True, top_log_probs=0)
    out = []
    for i, prompt in enumerate(prompts):
        opened = asyncio.Event()
        for j in range(k):
            own = {**knobs, "random_seed": body.seed_of(j)} if body.seed_of(j) is not None else knobs
            request_id = reply.id if len(prompts) * k == 1 else f"{reply.id}-{i * k + j}"
            stream = body.stream or (j == 0 and k > 1)
            piece_source = generate(app.state.triton, prompt, stream, own, request_id, config.request_timeout_s,
                                    content_spans)
            out.append(piece_source if k == 1 else _opening(piece_source, opened) if j == 0
                       else _after(piece_source, opened))
    return out


OPENED_AFTER = 2  # pieces of the first generation before the others start (its prompt blocks are cached)


async def _opening(pieces, opened: asyncio.Event):
    """The first generation of a prompt; ``opened`` is set after its second piece, or its end."""
    count = 0
    try:
        async for piece in pieces:
            count += 1
            if count >= OPENED_AFTER:
                opened.set()
            yield piece
    finally:
        opened.set()
        await pieces.aclose()


async def _after(pieces, opened: asyncio.Event):
    """A later generation of a prompt: it starts once the first has ``opened``."""
    try:
        await opened.wait()
        async for piece in pieces:
            yield piece
    finally:
        await pieces.aclose()


def _best(candidates: list, n: int) -> list:
    """``best_of``: the ``n`` generations of one prompt with the highest cumulative
    log-probability of their answer tokens (all of them when there are only ``n``)."""
    if len(candidates) <= n:
        return candidates

    def total(answer) -> float:
        _, stats, entries = answer
        answer_entries = entries[len(entries) - int(stats.get("generated_tokens", 0)):]
        return sum(e.logprob for e in answer_entries if e.logprob is not None)

    return sorted(candidates, key=total, reverse=True)[:n]


async def _echoes(app: FastAPI, config: FrontConfig, prompts: Sequence[Prompt], echo: bool) -> list[str]:
    """What ``echo`` puts before each answer: the prompt's text (a token-id prompt's as
    ``postprocessing`` decodes it); empty strings without ``echo``."""
    async def text(prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return await text_of(app.state.triton, prompt, config.request_timeout_s, "prompt")

    return list(await asyncio.gather(*(text(p) for p in prompts))) if echo else [""] * len(prompts)


async def _events(reply: Reply, body: GenerationBody, firsts: list[Piece], fanout: Fanout, prefixes: list[str],
                  scores: Optional[Scores] = None):
    """SSE events: each choice's first chunk (by index), then the pieces as they come, each
    choice's last chunk (its ``finish_reason`` and ``routing_stats``) when it ends; a
    disconnect or a stalled client closes this generator, and closing ``fanout`` cancels
    every generation. With ``scores`` a chunk carries the log-probabilities of the tokens that
    came with its text (a response whose tokens end in part of a character has no text yet:
    its tokens wait for the chunk that has)."""
    held: list[list] = [[] for _ in firsts]  # each choice's tokens whose text has not been sent

    def logprobs(index: int, text: str, last: bool = False):
        if scores is None or not (text or (last and held[index])):
            return None
        out, held[index] = scores.of(held[index], index), []
        return out

    try:
        stats = [first.stats for first in firsts]
        for index, first in enumerate(firsts):
            held[index] += first.prompt_logprobs + first.logprobs
            opening = prefixes[index] + first.text
            yield reply.chunk(opening, first=True, index=index, logprobs=logprobs(index, opening))
        try:
            async for index, piece in fanout.events():
                if piece is None:
                    yield reply.chunk("", stats[index], index=index, logprobs=logprobs(index, "", last=True))
                    continue
                stats[index] = piece.stats
                held[index] += piece.logprobs
                if piece.text:
                    yield reply.chunk(piece.text, index=index, logprobs=logprobs(index, piece.text))
        except OpenAIError as err:
            yield sse(err.body())
            yield DONE
            return
        if body.include_usage:
            yield reply.usage_chunk(*stats)
        yield DONE
    finally:
        await fanout.aclose()


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
