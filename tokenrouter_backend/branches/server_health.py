"""The health of one heavy server in a pool: up, or down until a readiness check says ready.

A server is marked down when a call cannot reach it. It is then skipped; once its back-off
has passed, one readiness check (``RemoteBranch.ready``) runs, never more than one at a
time, and its result marks the server up or doubles the back-off (capped), so a dead
server costs one health call per back-off period, not one failed call per request.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RECHECK_S = 1.0  # first readiness check after a server went down
DEFAULT_MAX_RECHECK_S = 15.0  # cap of the doubling back-off between checks


@dataclass
class ServerHealth:
    """Up/down state and check schedule of one server (times from ``time.monotonic``)."""

    recheck_s: float = DEFAULT_RECHECK_S
    max_recheck_s: float = DEFAULT_MAX_RECHECK_S
    up: bool = True
    last_error: str = ""
    next_check: float = 0.0  # when a down server may be checked again
    backoff_s: float = 0.0
    checking: bool = False  # a readiness check is in flight

    def mark_down(self, now: float, error: str) -> bool:
        """Record a failed call; True if the server was up until now."""
        was_up, self.up, self.last_error = self.up, False, error
        if was_up:
            self.backoff_s = self.recheck_s
            self.next_check = now + self.backoff_s
        return was_up

    def check_due(self, now: float) -> bool:
        """Whether a readiness check should start now (down, back-off over, none running)."""
        return not self.up and not self.checking and now >= self.next_check

    def checked(self, now: float, ready: bool) -> None:
        """The outcome of a readiness check."""
        self.checking = False
        if ready:
            self.up, self.last_error, self.backoff_s = True, "", 0.0
            return
        self.backoff_s = min(max(self.backoff_s, self.recheck_s) * 2, self.max_recheck_s)
        self.next_check = now + self.backoff_s

    def retry_in(self, now: float) -> float:
        """Seconds until the next check may run (0 when due)."""
        return max(0.0, self.next_check - now)
