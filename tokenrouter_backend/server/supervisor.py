"""The restart policy of `tokenrouter serve`: watch one tritonserver and bring it back.

When tritonserver exits unexpectedly or one of its Python stubs dies (a model that would
fail every request while Triton still answers ready; a stub that went with an admin's unload
or reload of its model does not count, and the new one is watched: `stub_set.py`),
`Supervisor` logs the cause, stops
what is left of the server (its process group and shared-memory regions: `TritonServer.stop`),
waits a doubling, capped backoff and starts it again on the same ports, at most
``max_restarts`` times within a sliding window; over the limit it gives up (exit code 1).
The only framework it touches is the `TritonServer` object it is given.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from tokenrouter_backend.server.errors import TritonServerError
from tokenrouter_backend.server.logs import tail
from tokenrouter_backend.server.process import POLL_INTERVAL_S, TritonServer

DEFAULT_MAX_RESTARTS = 3
DEFAULT_WINDOW_S = 600.0
DEFAULT_BACKOFF_S = 1.0
BACKOFF_CAP_S = 30.0          # the doubling backoff never waits longer than this
RESTARTS_FLAG = "--restarts"
WINDOW_FLAG = "--restart-window-s"
BACKOFF_FLAG = "--restart-backoff-s"
PREFIX = "tokenrouter serve: "


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``max_restarts`` restarts within any ``window_s`` seconds (0: never restart);
    the k-th restart in the window waits ``backoff_s * 2**(k-1)`` seconds, at most
    ``BACKOFF_CAP_S``."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_WINDOW_S
    backoff_s: float = DEFAULT_BACKOFF_S

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) \
                or self.max_restarts < 0:
            raise ValueError(f"{RESTARTS_FLAG} must be an integer >= 0, got {self.max_restarts!r}")
        if not self.window_s > 0:
            raise ValueError(f"{WINDOW_FLAG} must be > 0 seconds, got {self.window_s!r}")
        if not 0 <= self.backoff_s <= BACKOFF_CAP_S:
            raise ValueError(f"{BACKOFF_FLAG} must be in [0, {BACKOFF_CAP_S:g}] seconds, "
                             f"got {self.backoff_s!r}")

    def backoff(self, k: int) -> float:
        """Seconds to wait before the k-th restart in the window (k >= 1)."""
        return min(self.backoff_s * 2.0 ** (k - 1), BACKOFF_CAP_S)

    def describe(self) -> str:
        return f"{RESTARTS_FLAG} {self.max_restarts} within {WINDOW_FLAG} {self.window_s:g}"


class Cause(Enum):
    SERVER_EXITED = "tritonserver exited"
    STUB_DIED = "a model's Python stub died"
    RESTART_FAILED = "the restarted tritonserver did not become ready"


@dataclass(frozen=True)
class Death:
    """Why the server stopped serving: the cause, its detail, the log's last lines."""

    cause: Cause
    detail: str
    log_tail: str = ""

    def describe(self) -> str:
        text = f"{PREFIX}{self.cause.value}: {self.detail}"
        return text + (f"; last log lines:\n{self.log_tail}" if self.log_tail else "")


def describe_exit(code: int | None) -> str:
    """'code 1' / 'signal 9 (SIGKILL)' from a Popen return code."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stdout(text: str) -> None:
    print(text, flush=True)


class Supervisor:
    """Watches ``server`` (started and ready) until ``stop`` is set; restarts it per ``policy``.

    ``serving`` is cleared while a restarted server loads (the caller's signal handler may
    then abandon the wait at once) and set when it is ready again. ``clock`` and ``wait``
    (returns True when stop was requested) are injectable for tests.
    """

    def __init__(self, server: TritonServer, policy: RestartPolicy, stop: threading.Event, *,
                 serving: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], bool] | None = None, poll_s: float = POLL_INTERVAL_S,
                 say: Callable[[str], None] = _stdout, warn: Callable[[str], None] = _stderr,
                 endpoints: Callable[[], str] | None = None):
        self.server = server
        self.policy = policy
        self.stop = stop
        self.serving = serving if serving is not None else threading.Event()
        self.clock = clock
        self.wait = wait or stop.wait
        self.poll_s = poll_s
        self.say, self.warn = say, warn
        # where clients reach the server (serve's door, when it has one), for the "ready again" line
        self.endpoints = endpoints or (lambda: f"HTTP {server.http_url}, gRPC {server.grpc_url}")
        self.restarts: deque[float] = deque()  # times of the restarts within the window

    def watch(self, other_failure: Callable[[], str | None] = lambda: None) -> int:
        """0 once stop is requested; 1 when ``other_failure`` names one or the limit is hit."""
        self.serving.set()
        while not self.wait(self.poll_s):
            problem = other_failure()
            if problem:
                self.warn(PREFIX + problem)
                return 1
            death = self.death()
            if death is not None and not self.recover(death):
                return 0 if self.stop.is_set() else 1
        return 0

    def death(self) -> Death | None:
        """The server's death, if it died (what is left of it is stopped first). A dead server
        comes first: its stubs die with it."""
        if not self.server.is_running():
            code = self.server.stop()
            return Death(Cause.SERVER_EXITED, describe_exit(code), tail(self.server.log_text()))
        lost = self.server.lost_stubs()
        if lost:
            names = self.server.stub_names()
            stubs = ", ".join(f"model '{names.get(pid, '?')}' (pid {pid})" for pid in lost)
            self.server.stop()
            return Death(Cause.STUB_DIED, f"{stubs}; its model would fail every request while "
                                          "Triton still reports ready", tail(self.server.log_text()))
        return None

    def recover(self, death: Death) -> bool:
        """Restart until the server is ready again (True) or the limit / a stop ends it (False)."""
        while True:
            self.warn(death.describe())
            k = self._admit_restart()
            if k is None:
                return False
            delay = self.policy.backoff(k)
            self.say(f"{PREFIX}restarting tritonserver in {delay:g} s "
                     f"(restart {k} of {self.policy.max_restarts} in {self.policy.window_s:g} s)")
            if self.wait(delay):
                return False
            try:
                self._restart()
            except TritonServerError as err:
                death = Death(Cause.RESTART_FAILED, str(err))
                continue
            self.say(f"{PREFIX}restarted ({k} of {self.policy.max_restarts} in the window); "
                     f"ready again on {self.endpoints()}")
            return True

    def _admit_restart(self) -> int | None:
        """Count one more restart in the window (its number), or None over the limit."""
        now = self.clock()
        while self.restarts and now - self.restarts[0] >= self.policy.window_s:
            self.restarts.popleft()
        if self.stop.is_set():
            return None
        if self.policy.max_restarts == 0:
            self.warn(f"{PREFIX}restarts are off ({RESTARTS_FLAG} 0); stopping "
                      "(let a supervisor restart it)")
            return None
        if len(self.restarts) >= self.policy.max_restarts:
            self.warn(f"{PREFIX}restart limit reached: {len(self.restarts)} restarts in the last "
                      f"{self.policy.window_s:g} s (limit {self.policy.describe()}); stopping")
            return None
        self.restarts.append(now)
        return len(self.restarts)

    def _restart(self) -> None:
        self.server.stop()  # a failed earlier attempt may have left a process behind
        self.serving.clear()
        self.server.start()
        self.server.wait_ready()
        self.serving.set()
