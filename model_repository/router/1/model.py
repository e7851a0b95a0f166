"""Router model: the block loop over the heavy and light branches (see tokenrouter_backend.serving.router_model)."""
import asyncio

import triton_python_backend_utils as pb_utils

from tokenrouter_backend.serving.router_model import RouterModel

DRAIN_TIMEOUT_S = 30.0  # finalize waits this long for requests in flight


class TritonPythonModel:
    def initialize(self, args):
        self.model = RouterModel(pb_utils, args)
        self.loop = None

    async def execute(self, requests):
        self.loop = asyncio.get_running_loop()
        return await self.model.execute(requests)

    def finalize(self):
        if self.loop is not None and self.loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self.model.drain(DRAIN_TIMEOUT_S), self.loop)
            future.result(DRAIN_TIMEOUT_S + 5)
