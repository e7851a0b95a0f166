"""``DeadlineBranch``: every step of a branch answers within its deadline or fails by name.

Triton's request timeout (the ``branch_timeout_s`` a BLS call carries) holds only while a
request waits in the branch model's queue: a stopped (SIGSTOP) or deadlocked stub holds the
call it is executing, and every call queued behind it, for ever. The router wraps each
branch in a ``DeadlineBranch``: a step without an answer ``timeout_s`` after it was sent
(``branch_timeout_s`` + ``DEADLINE_SLACK_S``) raises ``BranchTimeout`` naming the branch,
so the request fails and gives its admission place back.

The call itself is left running, not cancelled: it reached the branch's queue and may
still run there. When it ends (the stub resumed) its answer is dropped and the session it
touched is released, after it, so no KV session stays behind on the branch. The request's
own release of that session, meanwhile, is left to that moment: it neither waits on the
stuck branch nor overtakes the late step. A step whose transport gave up by itself (a
``BranchTimeout`` of the inner branch: a gRPC deadline, the call cancelled) has its session
released at once, in the background.
"""
from __future__ import annotations

import asyncio
import logging

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult, BranchTimeout

log = logging.getLogger("tokenrouter.deadline")

DEADLINE_SLACK_S = 1.0  # beyond branch_timeout_s: Triton's own queue timeout speaks first when it applies


class DeadlineBranch(Branch):
    """``inner`` with a deadline on every step (see the module docstring)."""

    def __init__(self, inner: Branch, timeout_s: float):
        if not timeout_s > 0:
            raise ValueError(f"DeadlineBranch {inner.name}: timeout_s must be > 0, got {timeout_s!r}")
        self.inner = inner
        self.name = inner.name
        self.timeout_s = timeout_s
        self.late: dict[int, int] = {}  # session id -> its steps past the deadline still running
        self.late_answers = 0  # late steps that ended since (their answers dropped)
        self._background: set[asyncio.Task] = set()  # late steps and the releases after them

    def __repr__(self) -> str:
        return f"DeadlineBranch({self.inner!r}, timeout_s={self.timeout_s:g})"

    def __getattr__(self, name):  # the inner branch's own attributes (model name, url, close)
        return getattr(self.inner, name)

    @property
    def where(self) -> str:
        return getattr(self.inner, "where", f"{self.name} branch")

    async def step(self, op: BranchOp) -> BranchResult:
        task = asyncio.ensure_future(self.inner.step(op))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        except asyncio.CancelledError:  # the request itself was cancelled: so is its step
            task.cancel()
            raise
        if task in done:
            try:
                return task.result()
            except BranchTimeout:
                if not op.release:
                    self._release_later(op.session_id)
                raise
        self._left_running(op.session_id, task)
        raise BranchTimeout(f"{self.where}: no answer within {self.timeout_s:g} s (branch_timeout_s + "
                            f"{DEADLINE_SLACK_S:g} s): the branch model is stopped or stuck; this request's "
                            "session there is released when it answers again")

    async def release(self, session_id: int) -> None:
        if session_id in self.late:
            return  # released once its late step ends (``_left_running``)
        await super().release(session_id)

    def pending(self) -> int:
        """Late steps and releases still running (0 once the branch answered them all)."""
        return len(self._background)

    def _left_running(self, session_id: int, task: asyncio.Future) -> None:
        self.late[session_id] = self.late.get(session_id, 0) + 1
        self._background.add(task)

        def ended(task: asyncio.Future) -> None:
            self._background.discard(task)
            self.late_answers += 1
            if not task.cancelled():
                task.exception()  # retrieved: a late error is dropped like a late answer
            left = self.late.pop(session_id) - 1
            if left:
                self.late[session_id] = left
            else:
                self._release_later(session_id)

        task.add_done_callback(ended)

    def _release_later(self, session_id: int) -> None:
        task = asyncio.get_running_loop().create_task(self.release(session_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
