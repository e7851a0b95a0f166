"""Triton's admin APIs behind a header key: the flags `TritonServer` passes by default.

Triton serves model load/unload (with a file override a client could upload a Python model:
code execution), model configs, logging and trace settings, and shared-memory registration
on the same ports as inference. ``RESTRICTED_APIS`` are closed to any HTTP request or gRPC
call that lacks the header ``ADMIN_HEADER: <key>`` (HTTP) or the metadata
``triton-grpc-protocol-ADMIN_HEADER: <key>`` (gRPC) (``--http-restricted-api`` /
``--grpc-restricted-protocol``). Open: health, metadata, inference and statistics
(statistics carry the same per-model counts and timings as the metrics port, which Triton
cannot restrict). The key is ``$TOKENROUTER_ADMIN_KEY`` when set, else a random one per
server; `tokenrouter serve` writes it to a 0600 file and prints the file's path, never the key.
"""
from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

ADMIN_HEADER = "tokenrouter-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # Triton expects the gRPC metadata key with this prefix
ADMIN_KEY_ENV = "TOKENROUTER_ADMIN_KEY"
RESTRICTED_APIS = ("model-repository", "model-config", "logging", "shared-memory", "trace")
TRITON_APIS = ("health", "metadata", "inference", "shared-memory", "model-config",
               "model-repository", "statistics", "trace", "logging")
MIN_KEY_CHARS = 16


@dataclass(frozen=True)
class Restriction:
    """APIs closed without the admin header; ``apis=()`` opens everything."""

    apis: tuple[str, ...]
    key: str

    @classmethod
    def create(cls, apis: Sequence[str] = RESTRICTED_APIS, key: str | None = None,
               environ=os.environ) -> "Restriction":
        unknown = [a for a in apis if a not in TRITON_APIS]
        if unknown:
            raise ValueError(f"restricted_apis: unknown API(s) {unknown}; known: {', '.join(TRITON_APIS)}")
        key = key or (environ.get(ADMIN_KEY_ENV) or "").strip() or secrets.token_urlsafe(32)
        if len(key) < MIN_KEY_CHARS or any(c in key for c in " ,:="):
            raise ValueError(f"admin key must have at least {MIN_KEY_CHARS} characters and none of "
                             "' ,:=' (it is passed inside a tritonserver flag)")
        return cls(tuple(dict.fromkeys(apis)), key)

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP header a client adds to reach a restricted API."""
        return {ADMIN_HEADER: self.key}

    @property
    def grpc_headers(self) -> dict[str, str]:
        """The gRPC metadata a client adds to reach a restricted API."""
        return {GRPC_HEADER_PREFIX + ADMIN_HEADER: self.key}

    def flags(self) -> list[str]:
        if not self.apis:
            return []
        value = f"{','.join(self.apis)}:{ADMIN_HEADER}={self.key}"
        return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]

    def covers(self, api: str) -> bool:
        return api in self.apis


def write_key_file(path: Path, key: str) -> Path:
    """The admin key in a file only its owner can read (replaced if present). Written to a
    private temporary file and renamed over ``path``, so two servers starting at once on one
    data directory never fail on each other's file (the last one's key stands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
