"""``Branch`` backed by an engine in this process (tests, benchmarks, the GPU check)."""
from __future__ import annotations

import asyncio

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult


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
