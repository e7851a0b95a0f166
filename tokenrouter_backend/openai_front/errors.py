"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status.

``from_server`` sorts the server's error messages by whose fault they are, from the category
prefix the router writes (``core/protocol/failures.py``; a decoupled gRPC stream carries a
message only) or, for a unary call, the gRPC status Triton answered with:

=================================  ======  ===================  ====================  ===========
the server said                    status  type                 code                  Retry-After
=================================  ======  ===================  ====================  ===========
a field is wrong (names it)        400     invalid_request_error  (param: the field)    —
``server busy:`` / Triton's        429     server_error         server_busy           yes
"Exceeds maximum queue size"
``branch failure:``                502     server_error         branch_failed         —
``server stopping:``               503     server_error         server_stopping       yes
server not reachable / not ready   503     server_error         service_unavailable   yes
``request cancelled:``             499     server_error         request_cancelled     —
``router internal error:``         500     server_error         internal_error        —
anything else                      500     server_error         internal_error        —
=================================  ======  ===================  ====================  ===========

Busy is 429, not 503: the server is up and will serve the request once a place is free
(OpenAI's SDKs back off and retry a 429, honouring ``Retry-After``), and a 5xx would count
against the replica in a load balancer's outlier detection, ejecting a healthy, merely full
server. Messages never carry an address: ``redact`` replaces any that slipped through.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from tokenrouter_backend.core.protocol.failures import Failure, classify, strip_triton_prefixes

# ensemble (and preprocessing) input -> OpenAI field
OPENAI_NAMES = {"stop_words": "stop", "random_seed": "seed", "text_input": "prompt", "input_ids": "prompt"}
FIELD = re.compile(r"^([a-z_][a-z0-9_]*)(?:\[\d+\])? (?:must|has|is|needs)\b")  # InvalidRequest: "<field> must ..."
RETRY_AFTER_S = 1  # what a busy or restarting server asks a client to wait before retrying
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request the client (or its deadline) cancelled
# an address (host:port, IPv4, [IPv6], a URL) inside a message: never shown to a client
ADDRESS = re.compile(r"\b(?:[a-z][a-z0-9+.-]*://)\S+|\[[0-9A-Fa-f]*:[0-9A-Fa-f:.]*\](?::\d+)?"
                     r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?|\b[A-Za-z0-9.-]+:\d{2,5}\b")


def _utf8_safe(text: Optional[str]) -> Optional[str]:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class OpenAIError(Exception):
    """A request that fails; ``status`` is the HTTP status, ``type`` OpenAI's error type."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    param: Optional[str] = None
    code: Optional[str] = None
    retry_after_s: Optional[int] = None  # sent as the Retry-After header

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        """OpenAI's error shape; text with no UTF-8 form (a lone surrogate a request sent, echoed in
        the message) is escaped so the answer is always JSON."""
        return {"error": {"message": _utf8_safe(self.message), "type": self.type, "param": _utf8_safe(self.param),
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def redact(message: str) -> str:
    """``message`` with every address replaced by ``<address>``."""
    return ADDRESS.sub("<address>", message)


def not_found(message: str, code: str) -> OpenAIError:
    return OpenAIError(message, status=404, code=code)


def server_error(message: str) -> OpenAIError:
    return OpenAIError(redact(message), status=500, type="server_error", code="internal_error")


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(redact(message), status=503, type="server_error", code="service_unavailable",
                       retry_after_s=RETRY_AFTER_S)


_SERVER_SIDE = {  # Failure -> (status, code, Retry-After)
    Failure.BUSY: (429, "server_busy", RETRY_AFTER_S),
    Failure.BRANCH: (502, "branch_failed", None),
    Failure.STOPPING: (503, "server_stopping", RETRY_AFTER_S),
    Failure.CANCELLED: (CLIENT_CLOSED_REQUEST, "request_cancelled", None),
    Failure.INTERNAL: (500, "internal_error", None),
}


def from_server(message: str, grpc_status: str = "") -> OpenAIError:
    """An error the server answered with, as the OpenAI error a client should see.

    ``grpc_status`` is the status of a unary call (``StatusCode.INVALID_ARGUMENT``...), empty
    for an error inside the router's stream."""
    core = redact(strip_triton_prefixes(message))
    failure = classify(core)
    if failure in _SERVER_SIDE:
        status, code, retry = _SERVER_SIDE[failure]
        return OpenAIError(core, status=status, type="server_error", code=code, retry_after_s=retry)
    field = FIELD.match(core)
    if field or "INVALID_ARGUMENT" in grpc_status:
        name = field.group(1) if field else None
        return OpenAIError(core, param=OPENAI_NAMES.get(name, name))
    if "UNAVAILABLE" in grpc_status:
        return unavailable(core)
    return server_error(core)
