"""Whose fault a failed request is: the router's error messages, their categories and codes.

A request the router cannot serve ends with one error response. Its message starts with a
stable prefix naming the category (the one thing a client may parse: a decoupled gRPC
stream carries an error as a message only, without a status code), and the router also sets
the Triton error code where the transport keeps one (HTTP status, unary gRPC status):

============  ==========================  ===========  =============================================
category      message starts with         Triton code  meaning
============  ==========================  ===========  =============================================
invalid       ``<field> must|has|is|...``  INVALID_ARG  the request is wrong; the message names the field
busy          ``server busy:``            UNAVAILABLE  admission is full; retry later
branch        ``branch failure:``         UNAVAILABLE  a branch (model or server) failed; the server's
                                                       fault; the message names the branch only
cancelled     ``request cancelled:``      CANCELLED    the client cancelled (or went away)
stopping      ``server stopping:``        UNAVAILABLE  the router stopped while serving the request
internal      ``router internal error:``  INTERNAL     a bug; the server log has the traceback
============  ==========================  ===========  =============================================

Messages never carry a branch's address: the router logs the detail (with the address),
the client reads the branch's name and a coarse reason (``branch_failure``).
"""
from __future__ import annotations

import enum
import re


class Failure(enum.Enum):
    """A category of failed request: (message prefix, Triton error code name)."""

    INVALID = ("", "INVALID_ARG")
    BUSY = ("server busy:", "UNAVAILABLE")
    BRANCH = ("branch failure:", "UNAVAILABLE")
    CANCELLED = ("request cancelled:", "CANCELLED")
    STOPPING = ("server stopping:", "UNAVAILABLE")
    INTERNAL = ("router internal error:", "INTERNAL")

    @property
    def prefix(self) -> str:
        return self.value[0]

    @property
    def triton_code(self) -> str:
        return self.value[1]

    def message(self, detail: str) -> str:
        """The client's message for this category: its prefix, then ``detail``."""
        return f"{self.prefix} {detail}" if self.prefix else detail


# Triton's prefix on a composing model's error, and the "[request id: ...] " it may put first
_TRITON_PREFIXES = re.compile(r"^(?:\[request id: [^\]]*\] )?(?:in ensemble '[^']*', )?")
# tritonserver's own refusal when a model's queue policy bounds the queue (max_queue_size)
TRITON_QUEUE_FULL = "Exceeds maximum queue size"
_BRANCH_NAME = re.compile(r"^([A-Za-z_][\w-]*) branch\b")


def strip_triton_prefixes(message: str) -> str:
    """``message`` without the request-id and ensemble prefixes Triton adds."""
    return _TRITON_PREFIXES.sub("", message.strip(), count=1)


def classify(message: str) -> Failure | None:
    """The category of an error message the router sent (None: not one of the prefixed ones).

    A full queue reported by tritonserver itself (``max_queue_size``) counts as busy."""
    core = strip_triton_prefixes(message)
    for failure in Failure:
        if failure.prefix and core.startswith(failure.prefix):
            return failure
    if TRITON_QUEUE_FULL in core:
        return Failure.BUSY
    return None


def branch_failure(message: str, reason: str, failure: Failure = Failure.BRANCH) -> str:
    """The client's message for a branch error: the branch's name (from the message's leading
    ``<name> branch``, as every branch adapter writes it) and a coarse reason, nothing more."""
    match = _BRANCH_NAME.match(message)
    which = f"the {match.group(1)} branch" if match else "a branch"
    return failure.message(f"{which} {reason} (the server log has the detail)")
