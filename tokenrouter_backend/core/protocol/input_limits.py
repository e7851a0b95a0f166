"""Caps on request inputs, checked before any work is done on them.

Every refusal is an ``InvalidRequest`` naming the field and the limit. ``text_input`` is
measured in UTF-8 bytes *before* it is decoded or tokenized (``max_input_bytes``, a
preprocessing parameter, default 1 MiB); list inputs are counted before their elements are
looked at (``stop_words``: see ``stop_text``; ``STOP_IDS``, the router's flattened stop
token sequences: ``MAX_STOP_IDS`` entries).
"""
from __future__ import annotations

from typing import Sequence

from tokenrouter_backend.core.protocol.params import InvalidRequest

MIB = 1024 * 1024
DEFAULT_MAX_INPUT_BYTES = MIB
MAX_INPUT_BYTES_LIMIT = 64 * MIB  # the largest max_input_bytes a config may set
MAX_STOP_IDS = 1024  # STOP_IDS entries (ids plus -1 separators) one request may carry
UTF8_MAX_BYTES_PER_CHAR = 4


def max_input_bytes_from_config(value: int) -> int:
    """Validate the ``max_input_bytes`` parameter (1 .. 64 MiB)."""
    if not 1 <= value <= MAX_INPUT_BYTES_LIMIT:
        raise InvalidRequest(f"config parameter max_input_bytes must be in [1, {MAX_INPUT_BYTES_LIMIT}]; "
                             f"got {value}")
    return value


def check_count(field: str, count: int, limit: int) -> None:
    if count > limit:
        raise InvalidRequest(f"{field} has {count} entries; at most {limit} allowed")


def text_input(values: Sequence, max_bytes: int, field: str = "text_input") -> str:
    """The one prompt of a request (bytes or str elements), capped in bytes before decoding."""
    if len(values) != 1:
        raise InvalidRequest(f"{field} must hold exactly one string; got {len(values)} "
                             "(send one request per prompt)")
    value = values[0]
    raw = value.encode("utf-8", errors="replace") if isinstance(value, str) else bytes(value)
    if len(raw) > max_bytes:
        raise InvalidRequest(f"{field} is {len(raw)} bytes; at most max_input_bytes = {max_bytes} allowed")
    return raw.decode("utf-8", errors="replace")
