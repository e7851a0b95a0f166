"""``HeavyPool``: the heavy branch spread over several heavy servers, one session per server.

The router uses it when ``heavy_url`` lists more than one ``host:port``. Every session is
pinned to one server: a new session goes to the first server of its rendezvous ranking
(``rendezvous.ranked`` of the session id) that is up, and stays there until it is
released. When a call cannot reach the server (``ServerUnreachable``: refused, reset, the
process gone) the server is marked down (``server_health``) and its sessions move, each to
its next-ranked server that is up. Their KV cache died with the server, so a moved
session's next step raises ``SessionMissing`` and ``BranchView`` re-prefills the whole
context on the new server (counted in the request's ``reprefills``); a step that starts a
session (``keep_len`` 0) is simply sent to the next server. Other errors (a model error, a
deadline) fail the step as they would with one server. With every server down a step
fails at once with a ``BranchError`` naming each server and its last error.

A down server is skipped until a readiness check (one at a time, doubling back-off) finds
its model ready again; then new sessions reach it again (moved ones stay where they are).
``PoolCounters`` holds per-server calls, sessions and failovers for the router's metrics.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field

from tokenrouter_backend.branches.remote import RemoteBranch, ServerUnreachable
from tokenrouter_backend.branches.rendezvous import ranked
from tokenrouter_backend.branches.server_health import DEFAULT_MAX_RECHECK_S, DEFAULT_RECHECK_S, ServerHealth
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchOp,
    BranchResult,
    BranchUnreachable,
    SessionMissing,
)

log = logging.getLogger("tokenrouter.heavy_pool")

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


def parse_heavy_urls(text: str) -> tuple[str, ...]:
    """``heavy_url``'s servers: comma-separated ``host:port`` (whitespace ignored); () = BLS."""
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    for url in urls:
        match = _HOST_PORT.match(url)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise ValueError(f"heavy_url: {url!r} is not host:port with a port in 1..65535 "
                             f"(several servers: comma-separated)")
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    if duplicates:
        raise ValueError(f"heavy_url: {', '.join(duplicates)} listed more than once")
    return urls


@dataclass(frozen=True)
class PoolConfig:
    """Router config.pbtxt parameters ``heavy_pool_*`` (docs/configuration.md)."""

    recheck_s: float = DEFAULT_RECHECK_S  # first readiness check of a down server
    max_recheck_s: float = DEFAULT_MAX_RECHECK_S  # cap of the doubling back-off between checks
    check_timeout_s: float = 2.0  # deadline of one readiness check
    connect_retries: int = 1  # retries of an unreachable call before the server counts as down
    connect_backoff_s: float = 0.1  # delay before that retry

    def __post_init__(self):
        problems = [f"heavy_pool_{name} = {value} (allowed: {allowed})" for name, value, ok, allowed in (
            ("recheck_s", self.recheck_s, self.recheck_s > 0, "> 0"),
            ("max_recheck_s", self.max_recheck_s, self.max_recheck_s >= self.recheck_s, ">= heavy_pool_recheck_s"),
            ("check_timeout_s", self.check_timeout_s, self.check_timeout_s > 0, "> 0"),
            ("connect_retries", self.connect_retries, 0 <= self.connect_retries <= 10, "0..10"),
            ("connect_backoff_s", self.connect_backoff_s, 0 <= self.connect_backoff_s <= 10, "0..10"),
        ) if not ok]
        if problems:
            raise ValueError("invalid heavy pool settings: " + "; ".join(problems))


@dataclass
class PoolCounters:
    """What the pool did per server since the last ``take``: calls, sessions opened, failovers."""

    calls: dict[str, int] = field(default_factory=dict)
    opened: dict[str, int] = field(default_factory=dict)
    failovers: dict[str, int] = field(default_factory=dict)  # sessions moved away from a server

    def add(self, counts: dict[str, int], server: str, n: int = 1) -> None:
        counts[server] = counts.get(server, 0) + n


class HeavyPool(Branch):
    """One ``Branch`` over several ``RemoteBranch``es (one gRPC channel per server)."""

    def __init__(self, name: str, urls, model: str | None = None, *, timeout_s: float,
                 parameters: dict[str, str] | None = None, config: PoolConfig = PoolConfig()):
        urls = tuple(urls)
        if len(urls) < 2:
            raise ValueError(f"HeavyPool {name}: needs at least two servers, got {list(urls)}")
        self.name = name
        self.urls = urls
        self.config = config
        self.members = {url: RemoteBranch(name, url, model, timeout_s=timeout_s,
                                          connect_retries=config.connect_retries,
                                          backoff_s=config.connect_backoff_s, parameters=parameters)
                        for url in urls}
        self.health = {url: ServerHealth(config.recheck_s, config.max_recheck_s) for url in urls}
        self.pins: dict[int, str] = {}  # session id -> the server holding its KV
        self.counters = PoolCounters()
        self._checks: set[asyncio.Task] = set()

    def __repr__(self) -> str:
        return f"HeavyPool({self.name!r}, urls={list(self.urls)!r})"

    @property
    def where(self) -> str:
        return f"{self.name} branch (pool of {len(self.urls)}: {', '.join(self.urls)})"

    def sessions(self) -> dict[str, int]:
        """Live sessions pinned to each server."""
        counts = dict.fromkeys(self.urls, 0)
        for url in self.pins.values():
            counts[url] += 1
        return counts

    def up(self) -> dict[str, bool]:
        return {url: health.up for url, health in self.health.items()}

    def take_counters(self) -> PoolCounters:
        """The counters since the last call (the router turns them into metric increments)."""
        counters, self.counters = self.counters, PoolCounters()
        return counters

    async def step(self, op: BranchOp) -> BranchResult:
        if op.release:
            return await self._release(op)
        while True:
            before = self.pins.get(op.session_id)
            url = self._server_for(op.session_id) or await self._recover(op.session_id)
            if before not in (None, url) and op.keep_len > 0:  # moved: the new server lacks its KV
                raise SessionMissing(f"{self.where}: session {op.session_id} moved from {before} to {url}")
            try:
                self.counters.add(self.counters.calls, url)
                return await self.members[url].step(op)
            except ServerUnreachable as exc:
                self._lost(url, str(exc))
                if op.keep_len > 0:  # its KV died with the server: BranchView re-prefills
                    raise SessionMissing(f"{self.where}: session {op.session_id} lost with its server "
                                         f"{url} ({exc})") from exc

    async def close(self) -> None:
        for task in list(self._checks):
            task.cancel()
        for member in self.members.values():
            await member.close()

    # ---- placement -------------------------------------------------------------------
    def _server_for(self, session_id: int) -> str | None:
        """The session's server if up, else its first up server in rank order (pinned); None if none."""
        self._start_due_checks()
        url = self.pins.get(session_id)
        if url is not None and self.health[url].up:
            return url
        for candidate in ranked(self.urls, session_id):
            if self.health[candidate].up:
                self._pin(session_id, candidate, moved_from=url)
                return candidate
        return None

    def _pin(self, session_id: int, url: str, moved_from: str | None) -> None:
        self.pins[session_id] = url
        self.counters.add(self.counters.opened, url)
        if moved_from is not None:
            self.counters.add(self.counters.failovers, moved_from)
            log.warning("%s: session %d moves from %s to %s", self.where, session_id, moved_from, url)

    def _lost(self, url: str, error: str) -> None:
        if self.health[url].mark_down(time.monotonic(), error):
            log.warning("%s: %s is down (%s); its sessions move", self.where, url, error)

    async def _release(self, op: BranchOp) -> BranchResult:
        url = self.pins.pop(op.session_id, None)
        if url is None or not self.health[url].up:  # never opened, or gone with its server
            raise SessionMissing(f"{self.where}: session {op.session_id} is not held")
        return await self.members[url].step(op)

    # ---- health ----------------------------------------------------------------------
    def _start_due_checks(self) -> None:
        now = time.monotonic()
        for url, health in self.health.items():
            if health.check_due(now):
                task = asyncio.get_running_loop().create_task(self._check(url))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)

    async def _check(self, url: str) -> bool:
        health = self.health[url]
        health.checking = True
        ready = False
        try:
            ready = await self.members[url].ready(self.config.check_timeout_s)
        finally:
            health.checked(time.monotonic(), ready)
        if ready:
            log.warning("%s: %s is back", self.where, url)
        return ready

    async def _recover(self, session_id: int) -> str:
        """No server is up: wait for the checks now running (or due); a ready one takes the session."""
        self._start_due_checks()
        if self._checks:
            await asyncio.wait(list(self._checks), timeout=self.config.check_timeout_s + 1.0)
        url = self._server_for(session_id)
        if url is not None:
            return url
        now = time.monotonic()
        details = "; ".join(f"{u}: {h.last_error or 'down'} (next check in {h.retry_in(now):.1f} s)"
                            for u, h in self.health.items())
        raise BranchUnreachable(f"{self.where}: every heavy server is unreachable: {details}")
