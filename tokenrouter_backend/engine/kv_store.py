"""Per-session KV caches of one branch model: truncate/append, TTL expiry, a byte budget.

A session keeps ONE buffer ``[layers, 2 (key, value), kv_heads, capacity, head_dim]``. Capacity
grows geometrically (doubling while small, by a quarter once large: amortized O(1) append
with little slack); truncation only sets the length (rollback is free). The budget admits
new sessions only while the bytes in use are below it (``admit``): sessions of live requests
are never evicted to make room — an idle session goes only when its TTL runs out.
``gather`` builds a left-padded batch ``[layers, 2, B, kv_heads, P, head_dim]`` with one
strided copy per session, whose per-layer slices are the contiguous ``[B, kv_heads, P,
head_dim]`` past tensors the ONNX model takes. Framework-free (no Triton import).

Buffers are numpy arrays by default. A model that keeps its KV on an accelerator (the torch
runtime, ``torch_lm``) gives the store a ``KVArrays`` of torch tensors on its device at
construction: sessions, growth and ``gather`` then stay on that device (no host round trip
per step) and a one-session ``gather`` hands out views of the session buffer, no copy.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tokenrouter_backend.core.branch_protocol import BranchError, KVBudgetFull, SessionMissing

MIN_CAPACITY = 64  # tokens allocated for a new session
DOUBLING_LIMIT = 1024  # capacity doubles up to this many tokens, then grows by a quarter


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
    """One session's KV buffer, valid length and last use (mutable; owned by the store)."""

    __slots__ = ("session_id", "buf", "length", "last_use")

    def __init__(self, session_id: int, buf: np.ndarray, now: float):
        self.session_id = session_id
        self.buf = buf  # [L, 2, H, capacity, D]
        self.length = 0
        self.last_use = now

    @property
    def capacity(self) -> int:
        return self.buf.shape[3]

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes


class KVStore:
    """All sessions of one branch model instance (not thread-safe: one engine drives it)."""

    def __init__(self, shape: KVShape, ttl_s: float = 600.0, budget_bytes: int = 2 << 30,
                 name: str = "branch", clock: Callable[[], float] = time.monotonic,
                 arrays: KVArrays | None = None):
        self.shape = shape
        self.arrays = arrays or numpy_arrays(shape.dtype)
        self.ttl_s = ttl_s
        self.budget_bytes = budget_bytes
        self.name = name
        self.clock = clock
        self._sessions: OrderedDict[int, Session] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.expired = 0  # sessions dropped by TTL (observability)
        self.refused = 0  # new sessions refused because the budget was full
        self.peak_bytes = 0  # most KV bytes held at once

    # ---- bookkeeping -------------------------------------------------------------
    @property
    def bytes_in_use(self) -> int:
        return self._bytes

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def get(self, session_id: int) -> Session | None:
        """The live session or None (an expired one is dropped here)."""
        s = self._sessions.get(session_id)
        if s is not None and self.clock() - s.last_use > self.ttl_s:
            self._drop(session_id)
            self.expired += 1
            return None
        return s

    def release(self, session_id: int) -> bool:
        """Drop a session; False when it did not exist."""
        return self._drop(session_id)

    def expire(self) -> list[int]:
        """Drop every session idle for longer than the TTL; returns their ids."""
        cutoff = self.clock() - self.ttl_s
        gone = [sid for sid, s in self._sessions.items() if s.last_use < cutoff]
        for sid in gone:
            self._drop(sid)
        self.expired += len(gone)
        return gone

    def admit(self, session_id: int, tokens: int) -> None:
        """Refuse (``KVBudgetFull``) a NEW session needing ``tokens`` when it does not fit the budget.

        Existing sessions always go on (their request was admitted); the router bounds how
        many tokens live requests may reach, so they stay within the budget together.
        """
        if session_id in self._sessions:
            return
        need = max(tokens, min(MIN_CAPACITY, self.shape.max_len)) * self.shape.bytes_per_token()
        if self._bytes + need > self.budget_bytes and self._sessions:
            self.refused += 1
            mib = 1 << 20
            raise KVBudgetFull(
                f"{self.name}: KV cache full: {self._bytes / mib:.2f} MiB held by {len(self._sessions)} sessions; "
                f"a new session of {tokens} tokens needs {need / mib:.2f} MiB more than kv_cache_budget_mb="
                f"{self.budget_bytes / mib:g} allows; retry when requests finish")

    def _drop(self, session_id: int) -> bool:
        s = self._sessions.pop(session_id, None)
        if s is None:
            return False
        self._bytes -= s.nbytes
        return True

    # ---- one step ----------------------------------------------------------------
    def open(self, session_id: int, keep_len: int) -> Session:
        """Get (or create when keep_len == 0) a session, truncated to ``keep_len``, marked used."""
        s = self.get(session_id)
        if s is None:
            if keep_len > 0:
                raise SessionMissing(
                    f"{self.name}: session {session_id} does not exist (released or expired by "
                    f"TTL/LRU); keep_len {keep_len} needs its cache - start again with keep_len 0")
            s = self._create(session_id)
        if keep_len < 0 or keep_len > s.length:
            raise BranchError(
                f"{self.name}: keep_len {keep_len} is outside session {session_id}'s cache of "
                f"{s.length} tokens (allowed 0..{s.length})")
        s.length = keep_len
        s.last_use = self.clock()
        self._sessions.move_to_end(session_id)
        return s

    def _create(self, session_id: int) -> Session:
        sh = self.shape
        buf = self.arrays.empty((sh.num_layers, 2, sh.num_kv_heads, min(MIN_CAPACITY, sh.max_len),
                                 sh.head_dim))
        s = Session(session_id, buf, self.clock())
        self._sessions[session_id] = s
        self._bytes += s.nbytes
        self.peak_bytes = max(self.peak_bytes, self._bytes)
        return s

    def reserve(self, s: Session, tokens: int) -> None:
        """Make room for ``tokens`` in total (doubling; capped at the model's max length)."""
        if tokens <= s.capacity:
            return
        cap = s.capacity
        while cap < tokens:
            cap = cap * 2 if cap < DOUBLING_LIMIT else cap + cap // 4
        cap = max(min(cap, self.shape.max_len), tokens)
        new = self.arrays.empty(tuple(s.buf.shape[:3]) + (cap,) + tuple(s.buf.shape[4:]))
        new[:, :, :, : s.length] = s.buf[:, :, :, : s.length]
        self._bytes += new.nbytes - s.nbytes
        self.peak_bytes = max(self.peak_bytes, self._bytes)
        s.buf = new

    def append(self, s: Session, new_kv: list[tuple[np.ndarray, np.ndarray]], row: int, count: int) -> None:
        """Append ``count`` tokens of batch row ``row`` of per-layer (key, value) [B, H, S, D].

        new_kv is of the store's array kind (numpy, or torch on the store's device).
        """
        end = s.length + count
        self.reserve(s, end)
        for layer, (k, v) in enumerate(new_kv):
            s.buf[layer, 0, :, s.length:end] = k[row, :, :count]
            s.buf[layer, 1, :, s.length:end] = v[row, :, :count]
        s.length = end

    def gather(self, sessions: list[Session]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Left-padded past for a batch: per layer (key, value) [B, H, P, D], P = longest length."""
        sh = self.shape
        if len(sessions) == 1 and self.arrays.views_ok:  # no padding: views, no copy
            s = sessions[0]
            return [(s.buf[layer, 0, None, :, : s.length], s.buf[layer, 1, None, :, : s.length])
                    for layer in range(sh.num_layers)]
        past_len = max(s.length for s in sessions)
        batch = self.arrays.empty((sh.num_layers, 2, len(sessions), sh.num_kv_heads, past_len, sh.head_dim))
        for b, s in enumerate(sessions):
            pad = past_len - s.length
            if pad:
                batch[:, :, b, :, :pad] = 0  # masked out, but must not be NaN garbage
            batch[:, :, b, :, pad:] = s.buf[:, :, :, : s.length]
        return [(batch[layer, 0], batch[layer, 1]) for layer in range(sh.num_layers)]
