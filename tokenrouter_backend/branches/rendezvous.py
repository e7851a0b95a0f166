"""Rendezvous (highest-random-weight) hashing: which heavy server a session belongs to.

Each (server, key) pair gets a weight from BLAKE2b; a key belongs to the server with the
highest weight among those available. Removing a server moves only the keys it held (each
to its own second choice, so they spread over the others); adding one takes from every
server about 1/n of its keys. No ring or virtual nodes to tune, and exact for a few servers.
"""
from __future__ import annotations

import hashlib
from typing import Sequence


def weight(server: str, key: int) -> int:
    """The 64-bit weight of ``key`` on ``server`` (stable across processes and machines)."""
    digest = hashlib.blake2b(f"{server}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(servers: Sequence[str], key: int) -> list[str]:
    """``servers`` in preference order for ``key`` (first = its home server)."""
    return sorted(servers, key=lambda server: weight(server, key), reverse=True)
