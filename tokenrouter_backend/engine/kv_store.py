"""All KV sessions of one branch model: open/truncate/append, TTL expiry, a byte budget.

The budget admits new sessions only while the bytes in use are below it (``admit``):
sessions of live requests are never evicted to make room — an idle session goes only when
its TTL runs out; idle cached blocks go first. ``gather`` builds a left-padded batch
``[layers, 2, B, kv_heads, P, head_dim]`` with one strided copy per session, whose per-layer
slices are the contiguous ``[B, kv_heads, P, head_dim]`` past tensors the ONNX model takes.
What one session holds and how its tail grows: ``kv_session.py``. Framework-free (no Triton
import).

With a ``PrefixCache`` the confirmed full blocks of a session's tail move into the cache at
each step (or onto an identical cached block), and a session that starts on a sequence
whose leading blocks are cached takes them instead of computing them (``attach_prefix``).
A session's first block is keyed under its cache salt (``Session.root``, set when a step
starts the session), so sessions of different salts never share a block.
``gather`` copies blocks and tail into the batch as before.

With a ``KVArrays`` of torch tensors (the torch runtime) sessions, growth and ``gather`` stay
on the model's device (no host round trip per step) and a one-session ``gather`` hands out
views of the session buffer, no copy.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

import numpy as np

from tokenrouter_backend.core.protocol.branch_protocol import BranchError, KVBudgetFull, SessionMissing
from tokenrouter_backend.core.protocol.cache_salt import salt_key
from tokenrouter_backend.engine.kv_session import (
    MIN_CAPACITY,
    KVArrays,
    KVShape,
    Session,
    grown_capacity,
    numpy_arrays,
)
from tokenrouter_backend.engine.prefix_cache import PrefixCache, block_key


class KVStore:
    """All sessions of one branch model instance (not thread-safe: one engine drives it)."""

    def __init__(self, shape: KVShape, ttl_s: float = 600.0, budget_bytes: int = 2 << 30,
                 name: str = "branch", clock: Callable[[], float] = time.monotonic,
                 arrays: KVArrays | None = None, prefix_cache: PrefixCache | None = None):
        self.shape = shape
        self.prefix_cache = prefix_cache
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
        """Private tails plus cached blocks (shared or idle)."""
        return self._bytes + (self.prefix_cache.bytes if self.prefix_cache else 0)

    @property
    def session_bytes(self) -> int:
        """Bytes live sessions hold: their private tails and the blocks they share (once)."""
        cache = self.prefix_cache
        return self._bytes + (cache.bytes - cache.idle_bytes if cache else 0)

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
        """Drop a session; False when it did not exist. With the prefix cache on, the full
        blocks of its private tail go into the cache first: blocks are otherwise promoted when
        a session is opened again, so a session served in one step (a short request's light
        prefill and drafts) would never share its prompt with the next request."""
        s = self._sessions.get(session_id)
        if s is not None and self.prefix_cache is not None and not s.gap:
            self._promote(s, keep_tail=False)
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
        first = min(MIN_CAPACITY, self.shape.max_len)
        need = grown_capacity(first, tokens, self.shape.max_len) * self.shape.bytes_per_token()
        self._make_room(need)
        if self.bytes_in_use + need > self.budget_bytes and self._sessions:
            self.refused += 1
            mib = 1 << 20
            raise KVBudgetFull(
                f"{self.name}: KV cache full: {self.bytes_in_use / mib:.2f} MiB held by "
                f"{len(self._sessions)} sessions; "
                f"a new session of {tokens} tokens needs {need / mib:.2f} MiB more than kv_cache_budget_mb="
                f"{self.budget_bytes / mib:g} allows; retry when requests finish")

    def _make_room(self, need: int) -> None:
        """Evict idle cached blocks until ``need`` more bytes fit the budget (if they can)."""
        over = self.bytes_in_use + need - self.budget_bytes
        if over > 0 and self.prefix_cache is not None:
            self.prefix_cache.evict(over)

    def _drop(self, session_id: int) -> bool:
        s = self._sessions.pop(session_id, None)
        if s is None:
            return False
        self._bytes -= s.nbytes
        if self.prefix_cache is not None:
            self.prefix_cache.release(s.blocks)
        s.blocks = []
        return True

    # ---- one step ----------------------------------------------------------------
    def open(self, session_id: int, keep_len: int, cache_salt: str = "") -> Session:
        """Get (or create when keep_len == 0) a session, truncated to ``keep_len``, marked used;
        at keep_len 0 (no block held any more) its blocks are keyed under ``cache_salt``."""
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
        self._truncate(s, keep_len)
        if keep_len == 0:
            s.root = salt_key(cache_salt)
        if self.prefix_cache is not None and not s.gap:  # a window's entries lost context: never shared
            self._promote(s)
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
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
        return s

    def reserve(self, s: Session, tokens: int) -> None:
        """Make room for ``tokens`` in total (``grown_capacity``)."""
        tokens -= s.gap  # entries (a window's missing positions take no room)
        if tokens <= s.capacity:
            return
        base = s.prefix_len
        self._new_tail(s, grown_capacity(s.buf.shape[3], tokens - base, self.shape.max_len - base))

    def _new_tail(self, s: Session, cap: int) -> None:
        """Give ``s`` a private tail of ``cap`` positions holding its current tail tokens."""
        held = s.entries - s.prefix_len
        self._make_room((cap - s.buf.shape[3]) * self.shape.bytes_per_token())  # idle cached blocks yield
        new = self.arrays.empty(tuple(s.buf.shape[:3]) + (cap,) + tuple(s.buf.shape[4:]))
        new[:, :, :, :held] = s.buf[:, :, :, :held]
        self._bytes += new.nbytes - s.nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
        s.buf = new

    # ---- shared blocks (prefix cache) ----------------------------------------------
    def _truncate(self, s: Session, keep_len: int) -> None:
        """Keep the first ``keep_len`` positions; blocks past them are let go (a partly kept
        block's positions are copied into a new tail)."""
        if s.gap and keep_len <= s.sink:  # back inside the sink: every kept position is held
            s.gap = 0
        elif s.gap and keep_len < s.sink + s.gap:
            raise SessionMissing(
                f"{self.name}: session {s.session_id} keeps positions 0..{s.sink - 1} and "
                f"{s.sink + s.gap}.. only (kv_window); keep_len {keep_len} needs KV it dropped - start again "
                "with keep_len 0")
        if keep_len >= s.prefix_len:
            s.length = keep_len
            del s.tokens[keep_len:]
            return
        size = s.blocks[0].kv.shape[3]
        kept = keep_len // size
        part = s.blocks[kept]
        old_tail = s.buf
        s.buf = self.arrays.empty(tuple(old_tail.shape[:3]) + (max(size, MIN_CAPACITY),) + tuple(old_tail.shape[4:]))
        s.buf[:, :, :, : keep_len - kept * size] = part.kv[:, :, :, : keep_len - kept * size]
        self._bytes += s.buf.nbytes - old_tail.nbytes
        self.prefix_cache.release(s.blocks[kept:])
        del s.blocks[kept:]
        s.length = keep_len
        del s.tokens[keep_len:]

    def _promote(self, s: Session, keep_tail: bool = True) -> None:
        """Move the tail's full blocks into the cache (or onto identical cached ones); without
        ``keep_tail`` (the session is being dropped) the rest of the tail is left as it is."""
        cache, size = self.prefix_cache, self.prefix_cache.block_tokens
        moved = 0
        while s.length - s.prefix_len >= size:
            start = s.prefix_len
            parent = s.blocks[-1].key if s.blocks else s.root
            key = block_key(parent, s.tokens[start:start + size])
            blk = cache.acquire(key)
            if blk is None:
                self._make_room(size * self.shape.bytes_per_token())  # idle blocks yield to a live session's
                kv = self.arrays.empty(tuple(s.buf.shape[:3]) + (size,) + tuple(s.buf.shape[4:]))
                kv[...] = s.buf[:, :, :, moved * size:(moved + 1) * size]
                blk = cache.insert(key, kv, size * self.shape.bytes_per_token())
            s.blocks.append(blk)
            moved += 1
        if moved and keep_tail:
            held = s.length - s.prefix_len
            new = self.arrays.empty(tuple(s.buf.shape[:3]) + (max(MIN_CAPACITY, 2 * held),) + tuple(s.buf.shape[4:]))
            new[:, :, :, :held] = s.buf[:, :, :, moved * size:moved * size + held]
            self._bytes += new.nbytes - s.nbytes
            s.buf = new
            self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)

    def unshare(self, s: Session) -> None:
        """Copy ``s``'s shared blocks into its own tail and let them go (before a KV window
        drops positions: shared blocks are read-only)."""
        if not s.blocks:
            return
        held, prefix = s.entries - s.prefix_len, s.prefix_len
        new = self.arrays.empty(tuple(s.buf.shape[:3]) + (grown_capacity(MIN_CAPACITY, s.entries, self.shape.max_len),)
                                + tuple(s.buf.shape[4:]))
        at = 0
        for blk in s.blocks:
            size = blk.kv.shape[3]
            new[:, :, :, at:at + size] = blk.kv
            at += size
        new[:, :, :, prefix:prefix + held] = s.buf[:, :, :, :held]
        self._bytes += new.nbytes - s.nbytes
        self.prefix_cache.release(s.blocks)
        s.blocks, s.buf = [], new
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)

    def attach_prefix(self, s: Session, input_ids, limit: int) -> int:
        """Take cached KV for the leading ``input_ids`` of a session with no tail, at most
        ``limit`` positions: whole blocks shared, then the leading positions of the next
        block copied when all its tokens are in ``input_ids``. Returns the positions taken
        (the caller feeds the rest)."""
        cache = self.prefix_cache
        if cache is None or s.gap or s.length != s.prefix_len or limit <= 0:
            return 0
        size, got = cache.block_tokens, 0
        cache.stats.lookup_tokens += len(input_ids)
        while got + size <= len(input_ids):
            parent = s.blocks[-1].key if s.blocks else s.root
            chunk = [int(t) for t in input_ids[got:got + size]]
            key = block_key(parent, chunk)
            if got + size > limit:  # the caller must feed some of it: copy what it need not
                blk = cache.peek(key)
                if blk is not None:
                    take = limit - got
                    self.reserve(s, s.length + take)
                    s.buf[:, :, :, :take] = blk.kv[:, :, :, :take]
                    s.tokens.extend(chunk[:take])
                    s.length += take
                    got += take
                break
            blk = cache.acquire(key)
            if blk is None:
                break
            s.blocks.append(blk)
            s.tokens.extend(chunk)
            s.length += size
            got += size
        cache.stats.hit_tokens += got
        return got

    def append(self, s: Session, new_kv: list[tuple[np.ndarray, np.ndarray]], row: int, count: int,
               token_ids=()) -> None:
        """Append ``count`` tokens (``token_ids``) of batch row ``row`` of per-layer (key, value)
        [B, H, S, D].

        new_kv is of the store's array kind (numpy, or torch on the store's device).
        """
        end = s.length + count
        self.reserve(s, end)
        lo = s.entries - s.prefix_len
        hi = lo + count
        for layer, (k, v) in enumerate(new_kv):
            s.buf[layer, 0, :, lo:hi] = k[row, :, :count]
            s.buf[layer, 1, :, lo:hi] = v[row, :, :count]
        s.length = end
        if self.prefix_cache is not None and not s.gap:
            s.tokens.extend(int(t) for t in token_ids[:count])
            if len(s.tokens) != end:
                raise BranchError(f"{self.name}: KV append of {count} positions came with "
                                  f"{len(token_ids)} token ids (the prefix cache needs each one)")

    def gather(self, sessions: list[Session]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Left-padded past for a batch: per layer (key, value) [B, H, P, D], P = longest length."""
        sh = self.shape
        if len(sessions) == 1 and self.arrays.views_ok and not sessions[0].blocks:  # views, no copy
            s = sessions[0]
            return [(s.buf[layer, 0, None, :, : s.entries], s.buf[layer, 1, None, :, : s.entries])
                    for layer in range(sh.num_layers)]
        past_len = max(s.entries for s in sessions)
        batch = self.arrays.empty((sh.num_layers, 2, len(sessions), sh.num_kv_heads, past_len, sh.head_dim))
        for b, s in enumerate(sessions):
            pad = past_len - s.entries
            if pad:
                batch[:, :, b, :, :pad] = 0  # masked out, but must not be NaN garbage
            at = pad
            for blk in s.blocks:
                size = blk.kv.shape[3]
                batch[:, :, b, :, at:at + size] = blk.kv
                at += size
            batch[:, :, b, :, at:] = s.buf[:, :, :, : s.entries - s.prefix_len]
        return [(batch[layer, 0], batch[layer, 1]) for layer in range(sh.num_layers)]
