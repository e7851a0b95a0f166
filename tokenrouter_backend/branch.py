"""The ``Branch`` interface the block loop talks to, and its in-process implementation.

A Branch is one model (heavy or light) that serves ``BranchOp`` steps on KV sessions
(semantics in ``branch_protocol``). Implementations: ``InProcessBranch`` (an engine in this
process: tests, benchmarks), ``bls_branch.BlsBranch`` (inside Triton), and
``remote_branch.RemoteBranch`` (a branch model on another Triton server over gRPC).
"""
from __future__ import annotations

import abc
import asyncio

from .branch_protocol import BranchOp, BranchResult


class Branch(abc.ABC):
    """One model reachable by the router."""

    name: str  # "heavy" or "light": used in error messages and stats

    @abc.abstractmethod
    async def step(self, op: BranchOp) -> BranchResult:
        """Run one step; raises ``BranchError`` (or ``SessionMissing``) on failure."""

    async def release(self, session_id: int) -> None:
        """Drop a session; never raises (a vanished session is already released)."""
        try:
            await self.step(BranchOp(session_id=session_id, keep_len=0, input_ids=(0,), release=True))
        except Exception:  # noqa: BLE001 - release is best effort by contract
            pass


class InProcessBranch(Branch):
    """A branch backed by an engine in this process (``engine.run([op]) -> [result|exc]``).

    Steps run one at a time in a worker thread so the event loop keeps serving.
    """

    def __init__(self, name: str, engine):
        self.name = name
        self.engine = engine
        self._lock = asyncio.Lock()

    async def step(self, op: BranchOp) -> BranchResult:
        async with self._lock:
            (result,) = await asyncio.to_thread(self.engine.run, [op])
        if isinstance(result, Exception):
            raise result
        return result
