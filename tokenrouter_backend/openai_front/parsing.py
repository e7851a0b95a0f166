"""Request bodies become validated ``GenerationBody``s within the front's limits, off the event loop.

``parse`` (JSON → nesting depth → pydantic → ``check()`` → content size) runs in a
``BodyParser``: a body above ``INLINE_BODY_BYTES`` (16 KiB) goes to a pool of
``parse_workers`` spawned processes at niceness 19; a smaller one parses on the event loop
(at most about 2 ms, less than the round trip to a worker). JSON decoding and pydantic
validation are C and Rust code that hold the GIL for the whole call, so a worker *thread*
would still stall the event loop (an 8 MiB body of small chat messages holds it for about
1.7 s); a worker process does not, and at niceness 19 it takes the CPU from no generation.
The body reaches ``parse`` already read within ``max_body_bytes`` (``transport.BodyLimit``).
The chat template renders in a bounded thread of the front (``app.py``): its input is
already capped here. A completion holds at most ``max_prompts`` prompts (``prompt`` as a list).
The same path parses ``/tokenize`` (a chat body when it has ``messages``) and ``/detokenize``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import tempfile
import threading
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional, Union

from pydantic import ValidationError

from .errors import OpenAIError, unavailable
from .protocol import (
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    GenerationBody,
    TokenizeChatBody,
    TokenizeCompletionBody,
    TokenizerBody,
)

MIB = 1024 * 1024
# a 1 MiB prompt (the server's default max_input_bytes) fits even as JSON's worst escaping,
# six bytes per character ("\u0000"), with room for the other fields
DEFAULT_MAX_BODY_BYTES = 8 * MIB
DEFAULT_MAX_PROMPT_BYTES = MIB  # the prompt or all messages' text, UTF-8 (= the server's max_input_bytes)
DEFAULT_PARSE_WORKERS = 2
# prompts one completion may hold; each is a request of its own to the router, admitted as any
DEFAULT_MAX_PROMPTS = 64
PARSE_NICENESS = 19  # parsing a large body yields the CPU to generation and to the event loop
INLINE_BODY_BYTES = 16 * 1024  # smaller bodies parse on the event loop (at most ~2 ms), sparing the IPC
MAX_JSON_DEPTH = 32  # the schema needs 4 levels; metadata / response_format get room to spare
MAX_MESSAGES = 2048  # OpenAI's own limit on `messages`
SHM = "/dev/shm"
BODIES: dict[str, type[Union[GenerationBody, TokenizerBody]]] = {
    "completion": CompletionBody, "chat": ChatBody, "tokenize": TokenizeCompletionBody,
    "detokenize": DetokenizeBody}
Body = Union[GenerationBody, TokenizerBody]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    parse_workers: int = DEFAULT_PARSE_WORKERS
    max_prompts: int = DEFAULT_MAX_PROMPTS  # prompts in one completion (a list `prompt`)

    def __post_init__(self):
        for name in ("max_body_bytes", "max_prompt_bytes", "parse_workers", "max_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")


Parsed = Union[Body, dict]  # the body, or an OpenAIError's fields (exceptions do not pickle)


def parse(kind: str, data: bytes, max_prompt_bytes: int, max_prompts: int = DEFAULT_MAX_PROMPTS) -> Parsed:
    """One request body as its validated model; a refusal as the OpenAIError's fields."""
    try:
        return _parse(kind, data, max_prompt_bytes, max_prompts)
    except OpenAIError as err:
        return dataclasses.asdict(err)


def parse_file(kind: str, path: str, max_prompt_bytes: int, max_prompts: int = DEFAULT_MAX_PROMPTS) -> Parsed:
    """``parse`` of a body the front wrote to a file (what a worker process runs)."""
    with open(path, "rb") as f:
        return parse(kind, f.read(), max_prompt_bytes, max_prompts)


def _parse(kind: str, data: bytes, max_prompt_bytes: int, max_prompts: int) -> Body:
    try:
        value = json.loads(data)
    except RecursionError as exc:
        raise OpenAIError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        raise OpenAIError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise OpenAIError("the request body must be a JSON object")
    deep = _too_deep(value)
    if deep is not None:
        raise OpenAIError(f"{deep} nests deeper than {MAX_JSON_DEPTH} levels", param=deep)
    messages = value.get("messages")
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        raise OpenAIError(f"messages has {len(messages)} entries; at most {MAX_MESSAGES} allowed",
                          param="messages", code="array_above_max_length")
    model = TokenizeChatBody if kind == "tokenize" and "messages" in value else BODIES[kind]
    try:
        body = model.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"])
        raise OpenAIError(f"{param}: {err['msg']}", param=param or None) from exc
    body.check()
    if isinstance(body, CompletionBody) and len(body.prompts()) > max_prompts:
        raise OpenAIError(f"prompt holds {len(body.prompts())} prompts; at most {max_prompts} allowed (the "
                          "front's max_prompts)", param="prompt", code="array_above_max_length")
    field, size = _content_bytes(body)
    if size > max_prompt_bytes:
        raise OpenAIError(f"{field} holds {size} bytes of text; at most {max_prompt_bytes} allowed "
                          "(the front's max_prompt_bytes)", param=field, code="string_above_max_length")
    return _slim(body)


def _slim(body: Body) -> Body:
    """The body without what was accepted only to be ignored (``metadata``, ``response_format``
    ``text``...): the answer travels back to the front's process, and unpickling it there holds
    the GIL, so it carries only what the generation needs."""
    if isinstance(body, GenerationBody):
        body.__pydantic_extra__ = {}
    if isinstance(body, ChatBody):
        body.response_format = None
    return body


def _too_deep(value: dict) -> Optional[str]:
    """The top-level field whose value nests deeper than ``MAX_JSON_DEPTH`` (the body is level 1)."""
    for key, top in value.items():
        stack = [(top, 2)]
        while stack:
            node, depth = stack.pop()
            if not isinstance(node, (dict, list)):
                continue
            if depth > MAX_JSON_DEPTH:
                return str(key)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return None


def _content_bytes(body: Body) -> tuple[str, int]:
    """The text the prompt is made of (all prompts of a list), in UTF-8 bytes; text that has no
    UTF-8 form is refused."""
    for stop in body.stop_words() if isinstance(body, GenerationBody) else ():
        _utf8("stop", stop)
    if isinstance(body, (ChatBody, TokenizeChatBody)):
        return "messages", sum(len(_utf8("messages", v)) for m in body.template_messages()
                               for k, v in m.items() if k != "role")
    if isinstance(body, DetokenizeBody):
        return "tokens", 0
    return "prompt", sum(len(_utf8("prompt", text)) for text in body.prompt_texts())


def _utf8(field: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in the JSON)
        raise OpenAIError(f"{field} is not valid Unicode: {exc.reason} at {exc.start}", param=field) from exc


def _ready() -> bool:
    return True


class BodyParser:
    """``parse`` in a pool of spawned worker processes; a pool whose worker died is replaced."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._lock = threading.Lock()
        self._pool: Optional[ProcessPoolExecutor] = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawned, not forked: the front runs beside gRPC and uvicorn threads
                self._pool = ProcessPoolExecutor(self.limits.parse_workers, initializer=os.nice,
                                                 initargs=(PARSE_NICENESS,),
                                                 mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    async def start(self) -> None:
        """Spawn every worker now, so the first requests do not wait for a process to start."""
        loop = asyncio.get_running_loop()
        pool = self._executor()
        await asyncio.gather(*(loop.run_in_executor(pool, _ready) for _ in range(self.limits.parse_workers)))

    async def parse(self, kind: str, data: bytes) -> Body:
        if len(data) <= INLINE_BODY_BYTES:
            return _parse(kind, data, self.limits.max_prompt_bytes, self.limits.max_prompts)
        loop = asyncio.get_running_loop()
        pool = self._executor()
        # the body travels as a file (in memory where /dev/shm exists): written in one system call,
        # where a pipe would take one GIL round trip per 64 KiB and slow the event loop meanwhile
        fd, path = tempfile.mkstemp(prefix="tokenrouter-body-", dir=SHM if os.path.isdir(SHM) else None)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            parsed: Any = await loop.run_in_executor(pool, parse_file, kind, path, self.limits.max_prompt_bytes,
                                                     self.limits.max_prompts)
        except BrokenExecutor as exc:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise unavailable("a request parser process of the front died; the request can be retried") from exc
        finally:
            os.unlink(path)
        if isinstance(parsed, dict):
            raise OpenAIError(**parsed)
        return parsed

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
