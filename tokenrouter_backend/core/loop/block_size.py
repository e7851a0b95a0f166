"""The block-size schedule: how many drafts the next block asks for."""
from __future__ import annotations

from tokenrouter_backend.core.protocol.names import Schedule
from tokenrouter_backend.core.protocol.params import RouterParams


def next_block_size(params: RouterParams, current: int, drafted: int, accepted: int) -> int:
    """Block size for the next block (transformers' "heuristic" schedule when enabled).

    All drafts accepted -> draft 2 more next time; any rejected -> 1 fewer; bounded by
    [1, max_block_size]. The fixed schedule keeps the request's block_size.
    """
    if params.block_schedule == Schedule.FIXED:
        return params.block_size
    if drafted and accepted >= drafted:
        return min(current + 2, params.max_block_size)
    return max(1, current - 1)
