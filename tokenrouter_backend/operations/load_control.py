"""Load-adaptive routing: back off from speculation when it stops paying, return when it pays.

One ``LoadController`` per router, fed every finished block (``BlockRecord``), consulted
before every block. It runs on the event loop thread only, so it needs no lock. Signals:

* heavy queueing: per heavy call, wall time minus the branch's own forward time (hop +
  dynamic-batcher queue), as an EWMA (``ewma_alpha``). Saturated above ``queue_high_ms``,
  clear again below ``queue_low_ms`` (hysteresis).
* acceptance: per-token probability that heavy agrees with a light draft, from the
  verdicts of verify blocks and route fallbacks (each block: leading agreements are
  successes, a disagreement one failure), as exponentially decayed counts.

Actions (each bounded, each undone when its signal recovers):

1. block cap — with per-token acceptance a, the expected run of accepted drafts is
   a / (1 - a); drafting more than that + 1 mostly wastes light forwards, so the block
   is capped at clamp(round(a / (1 - a)) + 1, 1, max_block_size).
2. verify, acceptance < ``min_acceptance``: drafting is suspended (blocks run heavy-only,
   still lossless); every ``probe_every``-th block (counted across requests) still
   drafts a full ``block_size`` (uncapped) so the acceptance estimate keeps moving; resumes at ``resume_acceptance``.
3. route, heavy saturated: the confidence threshold is lowered by ``confidence_relief``
   but never below ``confidence_floor``, so more non-critical (moderately confident)
   tokens stay on light; tokens below the floor still go to heavy.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenrouter_backend.core.loop.hooks import BlockPlan, BlockRecord
from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import RouterParams

LEVEL_NORMAL, LEVEL_CAPPED, LEVEL_RELIEVED = 0, 1, 2


@dataclass(frozen=True)
class LoadConfig:
    """config.pbtxt parameters ``load_<field>`` (documented in docs/operations.md)."""

    control: bool = False  # load_control: off by default
    ewma_alpha: float = 0.2  # weight of the newest observation
    queue_high_ms: float = 50.0  # heavy queueing above this = saturated
    queue_low_ms: float = 20.0  # ... and below this = clear again
    min_acceptance: float = 0.3  # verify: suspend drafting below this per-token acceptance
    resume_acceptance: float = 0.45  # ... resume at or above this
    min_observations: float = 20.0  # verdicts needed before acceptance acts
    probe_every: int = 8  # while suspended, every Nth block (all requests) drafts anyway
    confidence_relief: float = 0.3  # route under saturation: threshold lowered by this
    confidence_floor: float = 0.5  # ... but never below this


class LoadController:
    def __init__(self, config: LoadConfig):
        self.config = config
        self.queue_ms = 0.0
        self._queue_seen = False
        self.successes = 0.0  # decayed counts of draft verdicts
        self.failures = 0.0
        self.saturated = False
        self.suspended = False
        self._suspended_blocks = 0  # blocks planned while suspended (probe counter)

    # ---- signals ----------------------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        n = self.successes + self.failures
        return self.successes / n if n >= self.config.min_observations else None

    def observe(self, record: BlockRecord) -> None:
        c = self.config
        if record.heavy_calls:
            queued = max(0.0, record.heavy_ms - record.heavy_forward_ms) / record.heavy_calls
            smoothed = (1 - c.ewma_alpha) * self.queue_ms + c.ewma_alpha * queued
            self.queue_ms = smoothed if self._queue_seen else queued
            self._queue_seen = True
        if record.heavy_agree:
            lead = next((i for i, a in enumerate(record.heavy_agree) if not a), len(record.heavy_agree))
            decay = 1 - c.ewma_alpha / 2  # per block with verdicts; ~10 blocks of memory at the default alpha
            self.successes = self.successes * decay + lead
            self.failures = self.failures * decay + (1 if lead < len(record.heavy_agree) else 0)
        self._update_states()

    def _update_states(self) -> None:
        c = self.config
        if self.saturated and self.queue_ms < c.queue_low_ms:
            self.saturated = False
        elif not self.saturated and self.queue_ms > c.queue_high_ms:
            self.saturated = True
        a = self.acceptance
        if a is not None:
            if self.suspended and a >= c.resume_acceptance:
                self.suspended = False
            elif not self.suspended and a < c.min_acceptance:
                self.suspended = True

    # ---- decisions --------------------------------------------------------------------
    def block_cap(self, max_block: int) -> int:
        a = self.acceptance
        if a is None or a >= 1.0:
            return max_block
        return max(1, min(max_block, round(a / (1 - a)) + 1))

    @property
    def level(self) -> int:
        if self.suspended or self.saturated:
            return LEVEL_RELIEVED
        return LEVEL_CAPPED if self.block_cap(1 << 30) < (1 << 30) else LEVEL_NORMAL

    def plan(self, params: RouterParams, block: int) -> BlockPlan:
        """The next block of one request under the current load."""
        if not self.config.control:
            return BlockPlan(params, block, params.mode)
        c, mode = self.config, params.mode
        if mode == Mode.VERIFY and self.suspended:
            self._suspended_blocks += 1
            # heavy-only block; a probe drafts a full block_size to measure acceptance again
            probe = self._suspended_blocks % max(1, c.probe_every) == 0
            return BlockPlan(params, params.block_size, Mode.VERIFY if probe else Mode.HEAVY)
        block = min(block, self.block_cap(params.max_block_size))
        if mode == Mode.ROUTE and self.saturated and params.confidence_threshold > c.confidence_floor:
            relieved = max(c.confidence_floor, params.confidence_threshold - c.confidence_relief)
            params = dataclasses.replace(params, confidence_threshold=relieved)
        return BlockPlan(params, block, mode)
