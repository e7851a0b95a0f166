"""heavy and light modes: the one branch generates every block itself (the baseline and the
roll-back switch)."""
from __future__ import annotations

from tokenrouter_backend.core.loop.modes.base import Strategy, branch_block
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.protocol.names import Mode, Source


class HeavyOnly(Strategy):
    async def block(self, state: RequestState, planned: Mode) -> None:
        await branch_block(state, state.heavy, Source.HEAVY)


class LightOnly(Strategy):
    async def block(self, state: RequestState, planned: Mode) -> None:
        await branch_block(state, state.light, Source.LIGHT)
