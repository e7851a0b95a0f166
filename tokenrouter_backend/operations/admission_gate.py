"""Bounded admission: how many requests run at once and how many KV tokens they may reach.

A request enters when fewer than ``max_live_requests`` run and its worst case — prompt +
max_tokens — fits the ``max_live_tokens`` still free (the exporter sets that from both
branches' KV budgets, so admitted requests never make a branch refuse a session or hold
more KV than its budget). Otherwise it waits in a FIFO queue of at most
``max_queued_requests`` for at most ``queue_timeout_s``; beyond either it is refused with
``ServerBusy`` naming the limit (its message starts ``server busy:``, the category
``core/protocol/failures.py`` documents); a request that could never fit is refused as invalid.
A waiting request whose client cancelled (``is_cancelled``, checked every ``CANCEL_POLL_S``)
leaves the queue at once with ``RequestCancelled``. One gate per router, used from its event
loop only.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from tokenrouter_backend.core.loop.block_loop import RequestCancelled
from tokenrouter_backend.core.protocol.params import InvalidRequest

CANCEL_POLL_S = 0.05  # how often a queued request asks whether its client cancelled


@dataclass(frozen=True)
class GateConfig:
    """Router config.pbtxt parameters (docs/configuration.md)."""

    max_live_requests: int = 32  # requests generating at once
    max_queued_requests: int = 256  # requests waiting beyond that
    queue_timeout_s: float = 60.0  # longest wait in the queue
    max_live_tokens: int = 0  # prompt + max_tokens summed over live requests; 0 = no bound

    def __post_init__(self):
        if self.max_live_requests < 1 or self.max_queued_requests < 0 or self.queue_timeout_s < 0 \
                or self.max_live_tokens < 0:
            raise ValueError(f"invalid admission limits {self}")


class ServerBusy(RuntimeError):
    """A request could not be admitted in time (message names the limit)."""


@dataclass
class _Waiter:
    tokens: int
    future: asyncio.Future


class AdmissionGate:
    def __init__(self, config: GateConfig = GateConfig()):
        self.config = config
        self.live = 0
        self.live_tokens = 0
        self.queue: deque[_Waiter] = deque()
        self.refused = 0  # requests refused busy (observability)
        self.cancelled = 0  # requests whose client cancelled while they were queued
        self.waited_ms = 0.0  # total time admitted requests spent queued

    def check(self, tokens: int) -> None:
        """Refuse at once a request that could never fit (it would wait for nothing): the
        request's fault, not a busy server (a client retrying it would retry for ever)."""
        limit = self.config.max_live_tokens
        if limit and tokens > limit:
            raise InvalidRequest(f"max_tokens is too large: prompt + max_tokens = {tokens} KV tokens, more than "
                                 f"max_live_tokens={limit} allows for all live requests together")

    def _fits(self, tokens: int) -> bool:
        c = self.config
        tokens_fit = not c.max_live_tokens or self.live_tokens + tokens <= c.max_live_tokens
        return self.live < c.max_live_requests and tokens_fit

    async def enter(self, tokens: int, is_cancelled: Callable[[], bool] = lambda: False) -> None:
        """Wait for a place (FIFO); raises ServerBusy when the queue is full or the wait too long,
        RequestCancelled as soon as ``is_cancelled()`` says the client gave up."""
        self.check(tokens)
        if not self.queue and self._fits(tokens):
            self._take(tokens)
            return
        c = self.config
        if len(self.queue) >= c.max_queued_requests:
            self.refused += 1
            raise ServerBusy(f"server busy: {self.live} live requests (max_live_requests={c.max_live_requests}) "
                             f"and {len(self.queue)} queued (max_queued_requests={c.max_queued_requests})")
        waiter = _Waiter(tokens, asyncio.get_running_loop().create_future())
        self.queue.append(waiter)
        t0 = time.perf_counter()
        try:
            await self._wait(waiter, t0 + c.queue_timeout_s, is_cancelled)
        except RequestCancelled:
            if waiter.future.done():  # admitted at the last moment: give the place back
                self.leave(tokens)
            else:
                self._drop(waiter)
            self.cancelled += 1
            raise
        except asyncio.TimeoutError:
            if waiter.future.done():  # admitted at the last moment: keep it
                return
            self._drop(waiter)
            self.refused += 1
            raise ServerBusy(f"server busy: waited queue_timeout_s={c.queue_timeout_s:g} s behind {self.live} live "
                             f"requests (max_live_requests={c.max_live_requests}, {self.live_tokens} of "
                             f"max_live_tokens={c.max_live_tokens or 'unbounded'} KV tokens in use)") from None
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.leave(tokens)  # admitted, then cancelled before running: give the place back
            else:
                self._drop(waiter)
            raise
        finally:
            self.waited_ms += (time.perf_counter() - t0) * 1e3

    @staticmethod
    async def _wait(waiter: _Waiter, deadline: float, is_cancelled: Callable[[], bool]) -> None:
        """Until admitted; TimeoutError at ``deadline`` (perf_counter), RequestCancelled when cancelled."""
        while not waiter.future.done():
            if is_cancelled():
                raise RequestCancelled("request cancelled by the client while queued for admission")
            left = deadline - time.perf_counter()
            if left <= 0:
                raise asyncio.TimeoutError
            await asyncio.wait({waiter.future}, timeout=min(left, CANCEL_POLL_S))

    def _drop(self, waiter: _Waiter) -> None:
        """A waiter leaves the queue without a place; those behind it may fit now."""
        if waiter in self.queue:
            self.queue.remove(waiter)
        waiter.future.cancel()
        self._wake()

    def leave(self, tokens: int) -> None:
        self.live -= 1
        self.live_tokens -= tokens
        self._wake()

    def _take(self, tokens: int) -> None:
        self.live += 1
        self.live_tokens += tokens

    def _wake(self) -> None:
        """Admit queued requests in order while the first one fits."""
        while self.queue and self._fits(self.queue[0].tokens):
            waiter = self.queue.popleft()
            if waiter.future.done():
                continue
            self._take(waiter.tokens)
            waiter.future.set_result(None)
