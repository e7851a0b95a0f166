"""Admission gate: live-request and KV-token bounds, FIFO queue, named refusals."""
import asyncio
import time

import pytest

from tokenrouter_backend.core.loop.block_loop import RequestCancelled
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.operations.admission_gate import CANCEL_POLL_S, AdmissionGate, GateConfig, ServerBusy


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


def test_a_request_whose_client_cancels_leaves_the_queue_at_once():
    """The client's cancellation (``is_cancelled``), not only the task's, ends the wait: its
    place in the queue goes to the request behind it long before queue_timeout_s."""
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=1, max_queued_requests=1, queue_timeout_s=30))
        await gate.enter(1)
        cancelled = False
        waiting = asyncio.ensure_future(gate.enter(1, lambda: cancelled))
        await asyncio.sleep(CANCEL_POLL_S)
        with pytest.raises(ServerBusy, match="max_queued_requests=1"):  # the queue is full
            await gate.enter(1)
        t0 = time.perf_counter()
        cancelled = True
        with pytest.raises(RequestCancelled, match="while queued"):
            await waiting
        left_after = time.perf_counter() - t0
        assert not gate.queue and gate.cancelled == 1 and gate.live == 1
        behind = asyncio.ensure_future(gate.enter(1))  # the freed queue place is taken at once
        await asyncio.sleep(0)
        gate.leave(1)
        await asyncio.wait_for(behind, 1.0)
        return left_after

    assert asyncio.run(go()) < 10 * CANCEL_POLL_S + 1.0  # polled, not queue_timeout_s (30 s)


def test_a_waiter_leaving_lets_a_smaller_one_behind_it_in():
    """FIFO waits for the head; when the head leaves (cancelled), the next one that fits enters."""
    async def go():
        gate = AdmissionGate(GateConfig(max_live_requests=5, max_live_tokens=100, queue_timeout_s=30))
        await gate.enter(60)
        gone = False
        head = asyncio.ensure_future(gate.enter(60, lambda: gone))  # does not fit
        await asyncio.sleep(0)
        small = asyncio.ensure_future(gate.enter(30))  # would fit, but waits behind the head
        await asyncio.sleep(CANCEL_POLL_S)
        assert not small.done()
        gone = True
        with pytest.raises(RequestCancelled):
            await head
        await asyncio.wait_for(small, 1.0)
        assert gate.live == 2 and gate.live_tokens == 90

    asyncio.run(go())


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="max_live_requests"):
        GateConfig(max_live_requests=0)
