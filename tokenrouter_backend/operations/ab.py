"""A/B split: token-level routing on a fixed share of requests, heavy-only on the rest.

The arm is a pure function of the request id (sha256 -> [0, 100)), so the same id always
lands in the same arm, across restarts and router instances. Requests without an id are
keyed by their prompt tokens (still reproducible). Every router metric carries the arm.
"""
from __future__ import annotations

import hashlib

from tokenrouter_backend.core.protocol.names import Mode

ARM_DEFAULT = "default"  # A/B split off (ab_route_percent = 100)
ARM_TOKEN = "token"  # A/B on: token-level routing (the configured mode)
ARM_REQUEST = "request"  # A/B on: request-level routing (whole request on heavy)
ARM_EXPLICIT = "explicit"  # the client chose router_mode itself: never reassigned
ARM_OVERRIDE = "override"  # the roll-back switch forced the mode
ARMS = (ARM_DEFAULT, ARM_TOKEN, ARM_REQUEST, ARM_EXPLICIT, ARM_OVERRIDE)
BASELINE_MODE = Mode.HEAVY  # what the request arm runs


def ab_bucket(key: str) -> float:
    """Uniform in [0, 100), stable for a key."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100.0


def request_key(request_id: str, prompt: tuple[int, ...]) -> str:
    return request_id if request_id else "prompt:" + ",".join(map(str, prompt))


def choose_arm(key: str, route_percent: float) -> str:
    """ARM_TOKEN for ``route_percent`` % of keys, else ARM_REQUEST; ARM_DEFAULT when off."""
    if route_percent >= 100.0:
        return ARM_DEFAULT
    return ARM_TOKEN if ab_bucket(key) < route_percent else ARM_REQUEST
