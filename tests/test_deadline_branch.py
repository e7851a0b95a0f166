"""DeadlineBranch: a step past its deadline fails by name; its late answer is dropped and its
session released after it, never before it and never leaked."""
import asyncio
import time

import numpy as np
import pytest

from tokenrouter_backend.branches.deadline import DeadlineBranch
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult, BranchTimeout


def _result() -> BranchResult:
    return BranchResult(tokens=np.array([7]), token_probs=np.ones(1), entropy=np.zeros(1),
                        input_probs=np.zeros(0), session_len=1)


class StoppableBranch(Branch):
    """A branch that answers in order, or holds every step while ``running`` is clear (a
    stopped stub); ``log`` is what it executed: (session, "step" | "release")."""

    def __init__(self):
        self.name = "heavy"
        self.running = asyncio.Event()
        self.running.set()
        self.log: list[tuple[int, str]] = []
        self.sessions: set[int] = set()

    @property
    def where(self) -> str:
        return "heavy branch (heavy)"

    async def step(self, op: BranchOp) -> BranchResult:
        await self.running.wait()
        if op.release:
            self.sessions.discard(op.session_id)
            self.log.append((op.session_id, "release"))
        else:
            self.sessions.add(op.session_id)
            self.log.append((op.session_id, "step"))
        return _result()


def test_a_step_that_answers_in_time_is_passed_through():
    async def go():
        inner = StoppableBranch()
        branch = DeadlineBranch(inner, timeout_s=1.0)
        got = await branch.step(BranchOp(1, 0, (1, 2)))
        await branch.release(1)
        return got, inner

    got, inner = asyncio.run(go())
    assert got.tokens.tolist() == [7] and inner.log == [(1, "step"), (1, "release")] and not inner.sessions


def test_a_stopped_branch_fails_the_step_by_name_within_the_deadline():
    async def go():
        inner = StoppableBranch()
        inner.running.clear()  # SIGSTOP
        branch = DeadlineBranch(inner, timeout_s=0.2)
        t0 = time.perf_counter()
        with pytest.raises(BranchTimeout, match=r"heavy branch \(heavy\): no answer within 0.2 s") as caught:
            await branch.step(BranchOp(5, 0, (1, 2, 3)))
        took = time.perf_counter() - t0
        t1 = time.perf_counter()
        await branch.release(5)  # the request's clean-up does not wait on the stopped branch
        release_took = time.perf_counter() - t1
        assert inner.log == [] and branch.late == {5: 1} and branch.pending() == 1
        inner.running.set()  # SIGCONT: the late step runs, then its session is released
        for _ in range(100):
            if branch.pending() == 0:
                break
            await asyncio.sleep(0.01)
        return caught.value, took, release_took, inner, branch

    error, took, release_took, inner, branch = asyncio.run(go())
    assert 0.2 <= took < 1.0 and release_took < 0.05, (took, release_took)
    assert "branch_timeout_s" in str(error)
    assert inner.log == [(5, "step"), (5, "release")]  # the late step first, its release after it
    assert not inner.sessions and branch.late == {} and branch.late_answers == 1


def test_an_inner_timeout_releases_the_session_at_once():
    """A transport that gave up by itself (a gRPC deadline) may still have run the step on the
    server: the session is released in the background."""
    class TimingOut(StoppableBranch):
        async def step(self, op):
            if not op.release:
                self.sessions.add(op.session_id)
                raise BranchTimeout("heavy branch (model 'heavy' at grpc://h:1): no answer within 1 s")
            return await super().step(op)

    async def go():
        inner = TimingOut()
        branch = DeadlineBranch(inner, timeout_s=5.0)
        with pytest.raises(BranchTimeout):
            await branch.step(BranchOp(9, 0, (1,)))
        for _ in range(100):
            if not branch.pending():
                break
            await asyncio.sleep(0.01)
        return inner

    inner = asyncio.run(go())
    assert inner.log == [(9, "release")] and not inner.sessions


def test_a_cancelled_request_cancels_its_step():
    async def go():
        inner = StoppableBranch()
        inner.running.clear()
        branch = DeadlineBranch(inner, timeout_s=5.0)
        task = asyncio.ensure_future(branch.step(BranchOp(3, 0, (1,))))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        return branch

    branch = asyncio.run(go())
    assert branch.pending() == 0 and branch.late == {}


def test_the_deadline_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        DeadlineBranch(StoppableBranch(), 0)
