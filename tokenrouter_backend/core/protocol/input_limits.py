"""Caps on request inputs, checked before any work is done on them.

Every refusal is an ``InvalidRequest`` naming the field and the limit. ``text_input`` is
measured in UTF-8 bytes *before* it is decoded or tokenized (``max_input_bytes``, a
preprocessing parameter, default 1 MiB); list inputs are counted before their elements are
looked at (``stop_words``: see ``stop_text``; ``STOP_IDS``, the router's flattened stop
token sequences: ``MAX_STOP_IDS`` entries).

The Python backend deserializes every BYTES input element by element before a model sees
the request; ``bounded_bytes_deserializer`` is the deserializer the text models and the
router install in their stub (``serving/tensors.bound_bytes_inputs``): past
``MAX_BYTES_ELEMENTS`` elements it stops reading and stands the tensor in with one
placeholder repeated (a zero-copy view, so the count check that follows refuses it by name),
and an element over ``MAX_BYTES_ELEMENT`` bytes is never copied (``OversizedElement``).
"""
from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.protocol.params import InvalidRequest

MIB = 1024 * 1024
DEFAULT_MAX_INPUT_BYTES = MIB
MAX_INPUT_BYTES_LIMIT = 64 * MIB  # the largest max_input_bytes a config may set
MAX_STOP_IDS = 1024  # STOP_IDS entries (ids plus -1 separators) one request may carry
UTF8_MAX_BYTES_PER_CHAR = 4
MAX_BYTES_ELEMENTS = 4096  # elements one BYTES input tensor is deserialized for (every legal one is far below)
MAX_BYTES_ELEMENT = MAX_INPUT_BYTES_LIMIT  # bytes one BYTES element is copied for


def max_input_bytes_from_config(value: int) -> int:
    """Validate the ``max_input_bytes`` parameter (1 .. 64 MiB)."""
    if not 1 <= value <= MAX_INPUT_BYTES_LIMIT:
        raise InvalidRequest(f"config parameter max_input_bytes must be in [1, {MAX_INPUT_BYTES_LIMIT}]; "
                             f"got {value}")
    return value


def check_count(field: str, count: int, limit: int) -> None:
    if count > limit:
        raise InvalidRequest(f"{field} has {count} entries; at most {limit} allowed")


def check_token_ids(field: str, ids, vocab: int | None) -> None:
    """Every id in [0, vocab) (vocab unknown: [0, 2^31))."""
    top = vocab if vocab is not None else 1 << 31
    for t in ids:
        if not 0 <= int(t) < top:
            raise InvalidRequest(f"{field} holds {t}; token ids are in [0, {top})")


def check_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidRequest(f"{field} must be in [{low}, {high}]; got {value}")
    return value


def check_ids(field: str, ids: np.ndarray, vocab_size: int) -> None:
    """Every token id in [0, vocab_size) (one vectorized pass), else refused naming the first bad one."""
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise InvalidRequest(f"{field}[{int(bad[0])}] is {int(ids.reshape(-1)[bad[0]])}; token ids must be in "
                             f"[0, {vocab_size - 1}]")


class OversizedElement:
    """Stands for a BYTES element over ``MAX_BYTES_ELEMENT`` bytes, which was never copied."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int | None):
        self.nbytes = nbytes  # None: an element of a tensor past MAX_BYTES_ELEMENTS (length not read)

    def __repr__(self) -> str:
        return "<not read>" if self.nbytes is None else f"<{self.nbytes} bytes, not read>"


class _Unread(np.ndarray):
    """A BYTES tensor of more than ``MAX_BYTES_ELEMENTS`` elements, left unread: the stub's
    ``reshape(dims)`` gets one placeholder broadcast to the tensor's shape (no copy)."""

    def reshape(self, *shape, **_kwargs):
        dims = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
        return np.broadcast_to(np.asarray(self)[:1], tuple(int(d) for d in dims))


def bounded_bytes_deserializer(max_elements: int = MAX_BYTES_ELEMENTS, max_element: int = MAX_BYTES_ELEMENT):
    """A drop-in for the Python backend's ``deserialize_bytes_tensor`` (4-byte little-endian
    length, then the bytes, per element) that reads at most ``max_elements`` elements."""

    def deserialize(encoded) -> np.ndarray:
        buf = memoryview(encoded).cast("B")
        items, offset, end = [], 0, len(buf)
        while offset < end:
            if len(items) == max_elements:
                return np.array([OversizedElement(None)], dtype=np.object_).view(_Unread)
            (length,) = struct.unpack_from("<I", buf, offset)
            offset += 4
            items.append(OversizedElement(length) if length > max_element else bytes(buf[offset:offset + length]))
            offset += length
        array = np.empty(len(items), dtype=np.object_)
        array[:] = items
        return array

    return deserialize


def text_input(values: Sequence, max_bytes: int, field: str = "text_input") -> str:
    """The one prompt of a request (bytes or str elements), capped in bytes before decoding."""
    count = values.size if isinstance(values, np.ndarray) else len(values)
    if count != 1:
        raise InvalidRequest(f"{field} must hold exactly one string; got {count} "
                             "(send one request per prompt)")
    value = values.flat[0] if isinstance(values, np.ndarray) else values[0]
    if isinstance(value, OversizedElement):
        raise InvalidRequest(f"{field} is over {MAX_BYTES_ELEMENT} bytes; at most max_input_bytes = {max_bytes} "
                             "allowed")
    raw = value.encode("utf-8", errors="replace") if isinstance(value, str) else bytes(value)
    if len(raw) > max_bytes:
        raise InvalidRequest(f"{field} is {len(raw)} bytes; at most max_input_bytes = {max_bytes} allowed")
    return raw.decode("utf-8", errors="replace")
