"""Branches of one server take turns on the CPU: one forward at a time, each at full speed.

Each branch model (heavy, light) is its own Python-backend stub process, and each sizes its
ONNX Runtime thread pool to every core. When their forwards overlap on a CPU, four threads
fight for two cores: each forward slows down 2-2.5x and the pair gets about 0.8 of the
machine (research/notebook/2026-12-03-two-branches-taking-turns.md). ``CoreTurns`` is an advisory
lock (``fcntl.flock``) on a path both branches of one server share, the model repository's
directory, held for the length of each forward: forwards run one after another, each as
fast as alone, and the pair gets the whole machine. The sessions stop spinning when a
forward ends (``OrtThreading.spin_between_runs``), so the next turn finds the cores free.

Inside ``run()`` (one engine run: one ``execute()``) a turn is kept across consecutive
forwards for up to ``slice_ms``, so a light model drafting k tokens (k short forwards) waits
for its turn once, not k times; a long series (prefill chunks) gives the turn back after each
slice. A turn waits at most ``max_wait_ms``; past that the forward runs anyway, beside the other
branch's (counted as an overlap), so one long forward (a prefill chunk) never stalls the
other branch's steps beyond that bound. Waiting blocks in the kernel (a helper thread holds
the blocking ``flock`` call), so the lock changes hands as soon as it is released; every
attempt uses its own open file description, so an abandoned wait that acquires late can
only release its own lock. No file is created and nothing outlives the process.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TurnStats:
    """Running totals of one branch's turns (fed to metrics)."""

    turns: int = 0          # forwards that ran holding the turn
    overlaps: int = 0       # forwards that ran without it (waited max_wait_ms)
    waited_ms: float = 0.0  # time spent waiting for turns


class CoreTurns:
    """One forward at a time among the processes that lock the same ``path``."""

    def __init__(self, path: str | os.PathLike, max_wait_ms: float, slice_ms: float = 0.0):
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if slice_ms < 0:
            raise ValueError(f"slice_ms must be >= 0, got {slice_ms}")
        self.path = Path(path)
        if not self.path.exists():
            raise ValueError(f"core turns: {self.path} does not exist")
        self.max_wait_s = max_wait_ms / 1e3
        self.slice_s = slice_ms / 1e3
        self.stats = TurnStats()
        self.last_wait_ms = 0.0
        self._in_run = False
        self._held: int | None = None  # fd of the turn kept inside run()
        self._held_since = 0.0

    @contextmanager
    def run(self):
        """Forwards inside share a turn for up to ``slice_ms``; the turn ends with the block."""
        self._in_run = True
        try:
            yield
        finally:
            self._in_run = False
            self._give_back()

    @contextmanager
    def turn(self):
        """Hold the turn for the body (or run it without, after ``max_wait_ms``)."""
        release = None  # fd to give back when the body ends
        if self._held is not None and time.perf_counter() - self._held_since < self.slice_s:
            self.last_wait_ms, got = 0.0, True  # still this run's slice
        else:
            self._give_back()
            t0 = time.perf_counter()
            fd = self._acquire()
            self.last_wait_ms = (time.perf_counter() - t0) * 1e3
            self.stats.waited_ms += self.last_wait_ms
            got = fd is not None
            if got and self._in_run and self.slice_s > 0:
                self._held, self._held_since = fd, time.perf_counter()  # run() or a later turn gives it back
            else:
                release = fd
        if got:
            self.stats.turns += 1
        else:
            self.stats.overlaps += 1
        try:
            yield got
        finally:
            if release is not None:
                _release(release)

    def _give_back(self) -> None:
        if self._held is not None:
            fd, self._held = self._held, None
            _release(fd)

    def _acquire(self) -> int | None:
        """An fd holding the lock, or None when ``max_wait_ms`` passed first."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except BaseException:
            os.close(fd)
            raise
        if self.max_wait_s <= 0:
            os.close(fd)
            return None
        return _BlockingWait(fd).result(self.max_wait_s)


class _BlockingWait:
    """A blocking flock on ``fd`` in a helper thread, given up after a timeout.

    Whoever comes second of the waiter (timed out) and the helper (acquired) closes the fd:
    an acquisition after the timeout is released at once; a timeout before it leaves the
    helper to close the fd when its call returns.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()
        self._done = threading.Event()  # the helper's flock call returned (set under _lock)
        self._acquired = False
        self._abandoned = False
        threading.Thread(target=self._wait, name="core-turn-wait", daemon=True).start()

    def _wait(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            acquired = True
        except OSError:
            acquired = False
        with self._lock:
            if self._abandoned:
                if acquired:
                    _release(self.fd)
                else:
                    os.close(self.fd)
                return
            self._acquired = acquired
            self._done.set()

    def result(self, timeout_s: float) -> int | None:
        self._done.wait(timeout_s)
        with self._lock:
            if not self._done.is_set():
                self._abandoned = True
                return None
            if self._acquired:
                return self.fd
            os.close(self.fd)
            return None


def _release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
