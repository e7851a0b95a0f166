"""Admission gate: live-request and KV-token bounds, FIFO queue, named refusals."""
import asyncio

import pytest

from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.operations.admission_gate import AdmissionGate, GateConfig, ServerBusy


def test_requests_beyond_the_bound_wait_in_order_then_run():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=2, queue_timeout_s=5))
        order = []

        async def request(i):
            await gate.enter(10)
            order.append(i)
            await asyncio.sleep(0.01)
            gate.leave(10)

        await asyncio.gather(*(request(i) for i in range(6)))
        return order, gate

    order, gate = asyncio.run(go())
    assert order == list(range(6)) and gate.live == 0 and gate.live_tokens == 0 and gate.refused == 0


def test_queue_timeout_is_server_busy_naming_the_limit():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=1, queue_timeout_s=0.05))
        await gate.enter(1)
        with pytest.raises(ServerBusy, match="queue_timeout_s=0.05.*max_live_requests=1"):
            await gate.enter(1)
        assert not gate.queue and gate.refused == 1
        gate.leave(1)
        await gate.enter(1)  # the place is free again

    asyncio.run(go())


def test_full_queue_is_refused_at_once():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=1, max_queued_requests=1, queue_timeout_s=5))
        await gate.enter(1)
        waiting = asyncio.ensure_future(gate.enter(1))
        await asyncio.sleep(0)
        with pytest.raises(ServerBusy, match="max_queued_requests=1"):
            await gate.enter(1)
        gate.leave(1)
        await waiting
        assert gate.live == 1

    asyncio.run(go())


def test_kv_tokens_bound_admission():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=10, max_live_tokens=100, queue_timeout_s=5))
        with pytest.raises(InvalidRequest, match="^max_tokens is too large.*max_live_tokens=100"):
            gate.check(101)  # never fits: the request's fault (400), not busy (retried for ever)
        await gate.enter(60)
        second = asyncio.ensure_future(gate.enter(60))  # does not fit next to the first
        await asyncio.sleep(0.01)
        assert not second.done() and gate.live_tokens == 60
        gate.leave(60)
        await second
        assert gate.live_tokens == 60 and gate.live == 1

    asyncio.run(go())


def test_a_cancelled_waiter_leaves_the_queue():
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=1, queue_timeout_s=5))
        await gate.enter(1)
        waiting = asyncio.ensure_future(gate.enter(1))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not gate.queue
        gate.leave(1)
        assert gate.live == 0

    asyncio.run(go())


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="max_live_requests"):
        GateConfig(max_live_requests=0)
