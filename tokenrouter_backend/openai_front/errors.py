"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status.

``from_server`` sorts the ensemble's error messages: the router refuses bad input with a
message naming the field (``InvalidRequest``) → 400; its own failures (``router internal
error``) and a branch's (``heavy: ...`` / ``light: ...``) → 500; a server that cannot be
reached → 503.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT

OPENAI_NAMES = {"stop_words": "stop", "random_seed": "seed", "text_input": "prompt"}  # ensemble -> OpenAI field
SERVER_FAILURE_PREFIXES = ("router internal error", f"{HEAVY}:", f"{LIGHT}:", "remote ")
ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")  # Triton's prefix on a composing model's error
FIELD = re.compile(r"^([a-z_][a-z0-9_]*)(?:\[\d+\])? (?:must|has|is|needs)\b")  # InvalidRequest: "<field> must ..."


@dataclass
class OpenAIError(Exception):
    """A request that fails; ``status`` is the HTTP status, ``type`` OpenAI's error type."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    param: Optional[str] = None
    code: Optional[str] = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def not_found(message: str, code: str) -> OpenAIError:
    return OpenAIError(message, status=404, code=code)


def server_error(message: str) -> OpenAIError:
    return OpenAIError(message, status=500, type="server_error", code="internal_error")


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(message, status=503, type="server_error", code="service_unavailable")


def from_server(message: str) -> OpenAIError:
    """An error the ensemble answered with, as the OpenAI error a client should see."""
    text = message.strip()
    core = ENSEMBLE_PREFIX.sub("", text)
    if any(core.startswith(p) for p in SERVER_FAILURE_PREFIXES):
        return server_error(text)
    field = FIELD.match(core)
    name = field.group(1) if field else None
    return OpenAIError(core, param=OPENAI_NAMES.get(name, name))
