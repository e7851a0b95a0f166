"""One block strategy per generation mode (``strategy_for``)."""
from __future__ import annotations

from tokenrouter_backend.core.loop.modes.base import Strategy
from tokenrouter_backend.core.loop.modes.route import Route
from tokenrouter_backend.core.loop.modes.single import HeavyOnly, LightOnly
from tokenrouter_backend.core.loop.modes.verify import Verify
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.protocol.names import Mode


def strategy_for(mode: Mode, state: RequestState) -> Strategy:
    if mode == Mode.ROUTE:
        return Route(state)
    if mode == Mode.VERIFY:
        return Verify(state)
    return LightOnly() if mode == Mode.LIGHT else HeavyOnly()
