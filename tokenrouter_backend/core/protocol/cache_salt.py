"""The per-request cache salt: which tenant's caches a request may read and fill.

Requests with different ``cache_salt`` values never share an answer-cache entry
(``core/loop/answer_cache.py``) or a KV prefix block (``engine/prefix_cache.py``), so the
cache-reuse counters of ``routing_stats`` only ever count reuse within the same salt. As in
vLLM, the salt is mixed into the key of the FIRST block of a prefix chain: every later
block's key depends on it through the chain. Requests without a salt form one shared tenant
(their keys are those of a server without salts). The salt is a name, not a secret the
server keeps: it is hashed (``salt_key``) before it reaches any cache.
"""
from __future__ import annotations

import hashlib

from tokenrouter_backend.core.protocol.params import InvalidRequest

CACHE_SALT = "cache_salt"  # the field / input name (vLLM's request field)
MAX_CACHE_SALT_BYTES = 256  # longest salt accepted, in UTF-8 bytes
UNSALTED = b""  # the key of salt-less requests (one shared tenant)
_PERSON = b"tr-cache-salt"  # blake2b personalization: salt keys are never a block or prompt hash


def parse_cache_salt(value) -> str:
    """A request's salt as sent (None, str or UTF-8 bytes) -> the salt ("" = none).

    Raises ``InvalidRequest`` naming the field for a non-string, text that is not UTF-8, or
    more than ``MAX_CACHE_SALT_BYTES`` bytes."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{CACHE_SALT} must be UTF-8 text") from None
    elif isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800")
            raise InvalidRequest(f"{CACHE_SALT} must be UTF-8 text") from None
    else:
        raise InvalidRequest(f"{CACHE_SALT} must be a string; got {type(value).__name__}")
    if len(raw) > MAX_CACHE_SALT_BYTES:
        raise InvalidRequest(f"{CACHE_SALT} is {len(raw)} bytes; at most {MAX_CACHE_SALT_BYTES} allowed")
    return value


def salt_key(salt: str) -> bytes:
    """16 bytes naming the salt's tenant in cache keys; ``UNSALTED`` (b"") for no salt."""
    if not salt:
        return UNSALTED
    return hashlib.blake2b(salt.encode("utf-8", errors="surrogatepass"), digest_size=16, person=_PERSON).digest()
