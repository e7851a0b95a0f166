"""The ``Branch`` interface the block loop talks to.

A Branch is one model (heavy or light) that serves ``BranchOp`` steps on KV sessions
(semantics in ``branch_protocol``). Implementations live in ``branches/``:
``in_process.InProcessBranch`` (an engine in this process: tests, benchmarks),
``bls.BlsBranch`` (inside Triton) and ``remote.RemoteBranch`` (a branch model on another
Triton server over gRPC).
"""
from __future__ import annotations

import abc

from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult


class Branch(abc.ABC):
    """One model reachable by the router."""

    name: str  # core.names HEAVY or LIGHT: used in error messages and stats

    @abc.abstractmethod
    async def step(self, op: BranchOp) -> BranchResult:
        """Run one step; raises ``BranchError`` (or ``SessionMissing``) on failure."""

    async def release(self, session_id: int) -> None:
        """Drop a session; never raises (a vanished session is already released)."""
        try:
            await self.step(BranchOp(session_id=session_id, keep_len=0, input_ids=(0,), release=True))
        except Exception:  # noqa: BLE001 - release is best effort by contract
            pass
