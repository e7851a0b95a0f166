"""Prefix KV cache of one branch model: fixed-size token blocks shared between sessions.

A block holds the KV of ``block_tokens`` consecutive positions ``[j*B, (j+1)*B)``. The KV
of a position depends only on the tokens up to it, so a block is named by a hash chain:
``key_j = blake2b(key_{j-1} + tokens of block j)`` — two sessions whose sequences agree on
the first ``(j+1)*B`` tokens have the same key for block j, whatever follows. The parent of
block 0 is the session's cache-salt key (``ROOT_KEY`` without a salt; vLLM mixes its
``cache_salt`` into the first block's hash the same way), so chains of different salts
never meet. Blocks are
read-only once made and shared: each session holding one counts as a reference. Blocks no
session holds stay cached for later requests (a repeated system prompt, the same retrieved
documents) and are evicted least recently used first, whenever the branch's KV budget
needs their room (cached blocks always yield before a live session is refused).
Framework-free; the block arrays are of the store's kind (numpy, or torch on a device).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ROOT_KEY = b""  # the parent of block 0 of a salt-less session
DEFAULT_BLOCK_TOKENS = 32  # prefix_cache_block_tokens default


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of the block holding ``tokens`` after the blocks named by ``parent``."""
    data = np.asarray(tokens, dtype="<i4").tobytes()
    return hashlib.blake2b(parent + data, digest_size=16).digest()


@dataclass(eq=False)
class CachedBlock:
    """One block's KV ``[layers, 2, kv_heads, B, head_dim]`` and its holders (mutable)."""

    key: bytes
    kv: object
    nbytes: int
    refs: int = 0


@dataclass
class PrefixCacheStats:
    """Counters for metrics (monotonic, except the gauges on ``PrefixCache``)."""

    lookup_tokens: int = 0  # input tokens of steps that looked for a cached prefix
    hit_tokens: int = 0  # of those, tokens whose KV came from the cache
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    evicted_bytes: int = 0


class PrefixCache:
    """Blocks by key; unreferenced ones in least-recently-used order (not thread-safe)."""

    def __init__(self, block_tokens: int = DEFAULT_BLOCK_TOKENS):
        if block_tokens < 1:
            raise ValueError(f"prefix_cache_block_tokens must be >= 1; got {block_tokens}")
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, CachedBlock] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.stats = PrefixCacheStats()

    @property
    def block_count(self) -> int:
        return len(self._blocks)

    @property
    def idle_bytes(self) -> int:
        """Bytes of blocks no session holds (what eviction can free)."""
        return sum(b.nbytes for b in self._blocks.values() if b.refs == 0)

    def acquire(self, key: bytes) -> CachedBlock | None:
        """The cached block named ``key`` with one more reference, or None."""
        blk = self._blocks.get(key)
        if blk is not None:
            blk.refs += 1
            self._blocks.move_to_end(key)
        return blk

    def peek(self, key: bytes) -> CachedBlock | None:
        """The cached block named ``key`` (marked used, no reference taken), or None."""
        blk = self._blocks.get(key)
        if blk is not None:
            self._blocks.move_to_end(key)
        return blk

    def insert(self, key: bytes, kv, nbytes: int) -> CachedBlock:
        """A new block (one reference: its maker's); an existing key is acquired instead."""
        blk = self.acquire(key)
        if blk is not None:
            return blk
        blk = CachedBlock(key, kv, nbytes, refs=1)
        self._blocks[key] = blk
        self.bytes += nbytes
        self.stats.inserted_blocks += 1
        return blk

    def release(self, blocks: Sequence[CachedBlock]) -> None:
        """Drop one reference of each block of a chain; they stay cached until evicted.

        The chain's tail is marked least recently used first, so eviction frees a chain from
        its end: a block whose parent is gone can never be found again.
        """
        for blk in reversed(blocks):
            blk.refs -= 1
            if blk.key in self._blocks:
                self._blocks.move_to_end(blk.key)

    def evict(self, need: int) -> int:
        """Free at least ``need`` bytes of unreferenced blocks, oldest first; returns bytes freed."""
        freed = 0
        for key in [k for k, b in self._blocks.items() if b.refs == 0]:
            if freed >= need:
                break
            blk = self._blocks.pop(key)
            freed += blk.nbytes
            self.stats.evicted_blocks += 1
        self.bytes -= freed
        self.stats.evicted_bytes += freed
        return freed

    def clear(self) -> int:
        """Drop every unreferenced block; returns bytes freed."""
        return self.evict(self.bytes)
