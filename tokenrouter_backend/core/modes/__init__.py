"""One block strategy per generation mode (``strategy_for``)."""
from __future__ import annotations

from tokenrouter_backend.core.modes.base import Strategy
from tokenrouter_backend.core.modes.route import Route
from tokenrouter_backend.core.modes.single import HeavyOnly, LightOnly
from tokenrouter_backend.core.modes.verify import Verify
from tokenrouter_backend.core.names import Mode
from tokenrouter_backend.core.request_state import RequestState


def strategy_for(mode: Mode, state: RequestState) -> Strategy:
    if mode == Mode.ROUTE:
        return Route(state)
    if mode == Mode.VERIFY:
        return Verify(state)
    return LightOnly() if mode == Mode.LIGHT else HeavyOnly()
