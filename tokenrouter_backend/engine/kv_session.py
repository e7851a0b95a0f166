"""One session's KV as the store keeps it: the buffer layout and its growth.

A session (``Session``) is a chain of shared read-only blocks (prefix cache on,
``prefix_cache.py``) followed by ONE private tail buffer ``[layers, 2 (key, value), kv_heads,
capacity, head_dim]``; a KV window (``kv_window.py``) may leave a gap after its sink.
Capacity grows geometrically (``grown_capacity``: by a quarter, at least 64 positions:
amortized O(1) append with little slack); truncation only sets the length (rollback is free).
``KVShape`` is one token's KV in a model; ``KVArrays`` says where buffers live: numpy arrays
by default, or (the torch runtime, ``torch_lm``) torch tensors on the model's device.
Framework-free (no Triton import).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tokenrouter_backend.engine.prefix_cache import ROOT_KEY, CachedBlock

MIN_CAPACITY = 64  # tokens allocated for a new session; also the smallest growth step


def grown_capacity(cap: int, tokens: int, limit: int) -> int:
    """The capacity a buffer of ``cap`` positions grows to for ``tokens``: by a quarter (at
    least ``MIN_CAPACITY``) at a time — amortized O(1) appends, at most max(25 %, 64
    positions) of slack, which the exporter's ``max_live_tokens`` allows for — never beyond
    ``limit`` (the model's positions) unless ``tokens`` needs it."""
    while cap < tokens:
        cap += max(cap // 4, MIN_CAPACITY)
    return max(min(cap, limit), tokens)


@dataclass(frozen=True)
class KVArrays:
    """Where KV buffers live: ``empty(shape)`` allocates one (numpy by default).

    views_ok: the model accepts strided views of a session buffer as past (torch does;
    ONNX Runtime wants contiguous host arrays, so numpy always gathers into a new batch).
    """

    empty: Callable[[tuple], object]
    views_ok: bool = False
    name: str = "numpy"


def numpy_arrays(dtype) -> KVArrays:
    """Host buffers of ``dtype`` (the default of ``KVStore``)."""
    dtype = np.dtype(dtype)
    return KVArrays(lambda shape: np.empty(shape, dtype=dtype))


@dataclass(frozen=True)
class KVShape:
    """Shape of one token's KV cache in a model (from ``ModelInfo``)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: np.dtype
    max_len: int  # model max positions: no session grows beyond it

    @classmethod
    def from_info(cls, info) -> "KVShape":
        return cls(info.num_layers, info.num_kv_heads, info.head_dim, np.dtype(info.kv_dtype),
                   info.max_position_embeddings)

    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize


class Session:
    """One session's KV: shared blocks, then a private tail buffer; its tokens, valid length
    and last use (mutable; owned by the store)."""

    __slots__ = ("session_id", "buf", "length", "last_use", "blocks", "tokens", "sink", "gap", "windowed", "root")

    def __init__(self, session_id: int, buf: np.ndarray, now: float):
        self.session_id = session_id
        self.buf = buf  # [L, 2, H, capacity, D]: positions prefix_len .. prefix_len + capacity
        self.length = 0  # positions held, blocks included
        self.last_use = now
        self.blocks: list[CachedBlock] = []  # shared read-only prefix (prefix cache on)
        self.tokens: list[int] = []  # the token of each held position (prefix cache on)
        self.root = ROOT_KEY  # parent key of its first block: its cache salt's key (``cache_salt.salt_key``)
        self.windowed = False  # a KV window (``kv_window.py``): positions may be dropped (then no sharing)
        self.sink = 0  # windowed: leading positions always kept
        self.gap = 0  # windowed: positions after the sink whose KV is gone (or was never computed)

    @property
    def entries(self) -> int:
        """KV entries held (positions minus the window's gap)."""
        return self.length - self.gap

    @property
    def prefix_len(self) -> int:
        """Positions held by shared blocks (all blocks have the same size)."""
        return len(self.blocks) * self.blocks[0].kv.shape[3] if self.blocks else 0

    @property
    def capacity(self) -> int:
        """Entries the session can hold without growing its tail."""
        return self.prefix_len + self.buf.shape[3]

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes
