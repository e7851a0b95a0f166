"""HeavyPool against fake Triton gRPC endpoints: placement, failover, health (no tritonserver)."""
from __future__ import annotations

import asyncio
import time

import pytest

from support.fake_triton_grpc import FakeBranchServer, scripted
from tokenrouter_backend.branches.heavy_pool import HeavyPool, PoolConfig, parse_heavy_urls
from tokenrouter_backend.branches.rendezvous import ranked
from tokenrouter_backend.core.loop.branch_view import BranchView
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.protocol.branch_protocol import BranchError, BranchOp, SessionMissing
from tokenrouter_backend.operations.metrics import SPEC_BY_NAME, pool_updates

FAST = PoolConfig(recheck_s=0.2, max_recheck_s=0.4, check_timeout_s=1.0, connect_retries=0, connect_backoff_s=0.0)


@pytest.fixture
def fakes():
    servers = [FakeBranchServer(scripted).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def pool_of(fakes, config: PoolConfig = FAST) -> HeavyPool:
    return HeavyPool("heavy", [f.url for f in fakes], timeout_s=5.0, config=config)


def sessions_homed_on(urls, url: str, n: int) -> list[int]:
    return [s for s in range(1000) if ranked(urls, s)[0] == url][:n]


def sent_sessions(fake) -> set[int]:
    return {op.session_id for _, op in fake.ops if not op.release}


def test_parse_heavy_urls_accepts_a_list_and_names_the_field_on_bad_input():
    assert parse_heavy_urls("") == ()
    assert parse_heavy_urls("heavy:8001") == ("heavy:8001",)
    assert parse_heavy_urls(" a:1, b.svc:8001 ,[::1]:9 ") == ("a:1", "b.svc:8001", "[::1]:9")
    for bad, why in (("a", "host:port"), ("a:0", "1..65535"), ("a:70000", "1..65535"), ("a:1,a:1", "more than once"),
                     ("http://a:1", "host:port")):
        with pytest.raises(ValueError, match="heavy_url") as err:
            parse_heavy_urls(bad)
        assert why in str(err.value)


def test_pool_config_errors_name_the_parameter_and_range():
    with pytest.raises(ValueError, match=r"heavy_pool_connect_retries = -1 \(allowed: 0\.\.10\)"):
        PoolConfig(connect_retries=-1)
    with pytest.raises(ValueError, match="heavy_pool_max_recheck_s"):
        PoolConfig(recheck_s=5, max_recheck_s=1)
    with pytest.raises(ValueError, match="at least two"):
        HeavyPool("heavy", ["a:1"], timeout_s=1.0)


def test_rendezvous_spreads_keys_and_moves_only_the_lost_servers_keys():
    servers = ["h0:8001", "h1:8001", "h2:8001"]
    homes = {key: ranked(servers, key)[0] for key in range(3000)}
    for server in servers:
        assert 800 < list(homes.values()).count(server) < 1200, "keys are not spread evenly"
    survivors = servers[:2]
    for key, home in homes.items():
        new = ranked(survivors, key)[0]
        assert new == home or home == "h2:8001", "a key moved although its server stayed"
    assert ranked(servers, 12345) == ranked(list(reversed(servers)), 12345)  # order of the list is irrelevant


def test_sessions_spread_and_stay_on_their_server(fakes):
    async def scenario():
        pool = pool_of(fakes)
        try:
            for sid in range(40):
                await pool.step(BranchOp(sid, 0, (1, 2)))
                await pool.step(BranchOp(sid, 2, (3,)))
            assert sum(pool.sessions().values()) == 40
            await pool.release(7)
            return pool.sessions(), pool.take_counters()
        finally:
            await pool.close()

    sessions, counters = asyncio.run(scenario())
    on = [sent_sessions(f) for f in fakes]
    assert on[0] and on[1], "every session went to one server"
    assert not on[0] & on[1], "a session's steps went to both servers"
    for fake, sids in zip(fakes, on):
        assert all(ranked([f.url for f in fakes], s)[0] == fake.url for s in sids)
    home7 = next(f for f in fakes if 7 in sent_sessions(f))
    assert [op.session_id for _, op in home7.ops if op.release] == [7]
    assert sum(sessions.values()) == 39
    assert sum(counters.calls.values()) == 80 and sum(counters.opened.values()) == 40 and not counters.failovers


def test_lost_server_sessions_reprefill_on_the_other(fakes):
    urls = [f.url for f in fakes]
    sid = sessions_homed_on(urls, fakes[0].url, 1)[0]

    async def scenario():
        pool = pool_of(fakes)
        stats = RequestStats()
        view = BranchView(pool, sid, stats)
        try:
            await view.step([5, 6, 7])
            await view.step([5, 6, 7, 8, 9])
            fakes[0].stop()  # the home server dies with the session's KV
            await view.step([5, 6, 7, 8, 9, 10, 11])
            return stats, pool.take_counters(), pool.up()
        finally:
            await pool.close()

    stats, counters, up = asyncio.run(scenario())
    assert stats.reprefills == 1
    resent = [op for _, op in fakes[1].ops]
    assert len(resent) == 1 and resent[0].keep_len == 0 and resent[0].input_ids == (5, 6, 7, 8, 9, 10, 11)
    assert counters.failovers == {fakes[0].url: 1} and up == {fakes[0].url: False, fakes[1].url: True}


def test_a_down_server_is_skipped_checked_sparingly_and_used_again_when_ready(fakes):
    urls = [f.url for f in fakes]
    a, b = fakes
    homed_on_a = sessions_homed_on(urls, a.url, 30)

    async def scenario():
        pool = pool_of(fakes)
        try:
            a.stop()
            await pool.step(BranchOp(homed_on_a[0], 0, (1,)))  # fails over at once (a new session)
            a.start()
            a.ready = False  # back on its port, model not ready yet
            t_end = time.monotonic() + 0.5
            i = 1
            while time.monotonic() < t_end:
                await pool.step(BranchOp(homed_on_a[i % 20], 0, (1,)))
                i += 1
                await asyncio.sleep(0.01)
            assert not sent_sessions(a), "a down server received steps"
            checks_while_unready = a.ready_checks
            a.ready = True
            await asyncio.sleep(0.5)  # past the back-off (0.4 s cap)
            await pool.step(BranchOp(homed_on_a[25], 0, (1,)))  # starts the check
            await asyncio.sleep(0.2)
            await pool.step(BranchOp(homed_on_a[26], 0, (1,)))
            return checks_while_unready, pool.up()
        finally:
            await pool.close()

    checks, up = asyncio.run(scenario())
    assert 1 <= checks <= 3, f"{checks} readiness checks in 0.5 s: the down server is hammered"
    assert up[a.url]
    assert homed_on_a[26] in sent_sessions(a), "a server that is back gets its new sessions again"
    assert homed_on_a[0] in sent_sessions(b)


def test_every_server_down_fails_fast_naming_each(fakes):
    async def scenario():
        pool = pool_of(fakes)
        try:
            for f in fakes:
                f.stop()
            t0 = time.monotonic()
            with pytest.raises(BranchError) as err:
                await pool.step(BranchOp(3, 0, (1,)))
            return str(err.value), time.monotonic() - t0
        finally:
            await pool.close()

    message, took = asyncio.run(scenario())
    assert "every heavy server is unreachable" in message
    assert all(f.url in message for f in fakes)
    assert took < 5.0


def test_release_of_a_session_on_a_lost_server_sends_nothing(fakes):
    urls = [f.url for f in fakes]
    sid = sessions_homed_on(urls, fakes[0].url, 1)[0]

    async def scenario():
        pool = pool_of(fakes)
        try:
            await pool.step(BranchOp(sid, 0, (1,)))
            fakes[0].stop()
            with pytest.raises(SessionMissing):
                await pool.step(BranchOp(sid, 1, (2,)))
            await pool.release(sid)  # never raises, never reaches the other server
            return pool.sessions()
        finally:
            await pool.close()

    assert sum(asyncio.run(scenario()).values()) == 0
    assert not fakes[1].ops


def test_pool_updates_cover_every_server():
    updates = pool_updates({"a:1": 3}, {"a:1": 1}, {"b:2": 1}, {"a:1": 1, "b:2": 0}, {"a:1": True, "b:2": False})
    assert ("tokenrouter_router_heavy_server_calls_total", {"server": "a:1"}, 3) in updates
    assert ("tokenrouter_router_heavy_server_failovers_total", {"server": "b:2"}, 1) in updates
    assert ("tokenrouter_router_heavy_server_up", {"server": "b:2"}, 0) in updates
    assert all(name in SPEC_BY_NAME for name, _, _ in updates)
