"""An in-process heavy/light pair: engines over any runtime (ONNX or torch) and one-request
generation through the real block loop, without Triton (tests, the GPU check, benches)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tokenrouter_backend.branches.in_process import InProcessBranch
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.hooks import BlockHooks
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT, Mode
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig


@dataclass(frozen=True)
class LocalPair:
    """Two in-process branches sharing nothing but the block loop that drives them."""

    light: InProcessBranch
    heavy: InProcessBranch

    @classmethod
    def of(cls, light_lm, heavy_lm, config: EngineConfig | None = None) -> "LocalPair":
        config = config or EngineConfig()
        return cls(InProcessBranch(LIGHT, BranchEngine(light_lm, config=config, name=LIGHT)),
                   InProcessBranch(HEAVY, BranchEngine(heavy_lm, config=config, name=HEAVY)))

    def generate(self, prompt, mode: Mode | str, session_id: int = 1, end_id: int | None = None,
                 **knobs) -> tuple[list[int], RequestStats]:
        """Run one request (``knobs``: request inputs such as max_tokens, block_size)."""
        return asyncio.run(self.generate_async(prompt, mode, session_id, end_id, **knobs))

    async def generate_async(self, prompt, mode: Mode | str, session_id: int = 1, end_id: int | None = None,
                             **knobs) -> tuple[list[int], RequestStats]:
        params = RouterDefaults().request_params({"router_mode": mode, **knobs})
        return await self.run(GenerationRequest(tuple(int(t) for t in prompt), params, end_id=end_id), session_id)

    async def run(self, request: GenerationRequest, session_id: int = 1, hooks: BlockHooks | None = None,
                  request_id: str = "") -> tuple[list[int], RequestStats]:
        """Run a built request (stop tokens, route gate) with optional per-block hooks."""
        tokens: list[int] = []
        stats = await generate(request, self.light, self.heavy,
                               lambda new, _stats, _done: tokens.extend(int(t) for t in new),
                               session_id=session_id, hooks=hooks, request_id=request_id)
        return tokens, stats
