"""Route thresholds that move: conservative start (server-wide) and dynamic (per request).

Conservative start: a ``route`` deployment starts at ``start_threshold`` (heavy on anything
uncertain) and lowers its confidence threshold in ``step``s toward the configured
``confidence_threshold`` — one step only once the heavy verdicts logged so far (verify
blocks and route fallbacks) show that among light tokens at or above the next threshold
at least ``min_samples`` were checked since the last step and at most ``max_disagreement``
of them were not the heavy model's choice. It never widens past the configured threshold and never
narrows again on its own (the roll-back switch is the operator's tool for that).

Dynamic threshold: with quantile q > 0 a request's threshold for its next block is the
q-quantile of the light confidences it has drafted so far, clipped to [min, max]; so
about a fraction q of its tokens go to heavy whatever the light model's calibration on
that text. Until ``DYNAMIC_WARMUP`` confidences are seen the static threshold applies.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.hooks import BlockRecord

BINS = 100  # confidence histogram resolution for verdict counts
DYNAMIC_WARMUP = 8  # confidences a request needs before its dynamic threshold applies
DYNAMIC_WINDOW = 256  # most recent confidences the quantile looks at


@dataclass(frozen=True)
class ConservativeConfig:
    """config.pbtxt parameters ``conservative_<field>``."""

    start: bool = False  # conservative_start: off by default
    start_threshold: float = 0.99  # first threshold in force
    step: float = 0.05  # threshold lowered by this per widening
    max_disagreement: float = 0.02  # allowed heavy disagreement among tokens >= next threshold
    min_samples: int = 200  # verdicts needed at >= next threshold before widening


@dataclass(frozen=True)
class DynamicConfig:
    """config.pbtxt parameters ``dynamic_threshold_<field>`` (quantile also per request)."""

    quantile: float = 0.0  # 0 = off
    min: float = 0.3  # dynamic threshold never below
    max: float = 0.99  # ... nor above


class ConservativeStart:
    """Server-wide threshold floor that widens as agreement evidence accumulates."""

    def __init__(self, config: ConservativeConfig, target: float):
        self.config = config
        self.target = target
        self.threshold = max(config.start_threshold, target) if config.start else target
        self.checked = np.zeros(BINS + 1)  # verdicts per confidence bin
        self.disagreed = np.zeros(BINS + 1)

    def observe(self, record: BlockRecord) -> None:
        if not self.config.start or self.threshold <= self.target:
            return
        for v in record.verdicts():
            b = _bin(v.confidence)
            self.checked[b] += 1
            self.disagreed[b] += not v.agree
        self._maybe_widen()

    def _maybe_widen(self) -> None:
        c = self.config
        nxt = max(self.target, self.threshold - c.step)
        b = _bin(nxt)
        n, m = self.checked[b:].sum(), self.disagreed[b:].sum()
        if n >= c.min_samples and m / n <= c.max_disagreement:
            self.threshold = nxt
            self.checked[:] = 0  # each step needs its own fresh evidence
            self.disagreed[:] = 0

    def floor(self, threshold: float) -> float:
        """A request's route threshold with the conservative floor applied."""
        return max(threshold, self.threshold) if self.config.start else threshold


class DynamicThreshold:
    """Per-request: threshold = clipped q-quantile of the request's own light confidences."""

    def __init__(self, config: DynamicConfig, quantile: float):
        self.config, self.quantile = config, quantile
        self.seen: list[float] = []

    def observe(self, record: BlockRecord) -> None:
        if self.quantile > 0:
            self.seen.extend(record.confidence)
            del self.seen[:-DYNAMIC_WINDOW]

    def threshold(self, static: float) -> float:
        if self.quantile <= 0 or len(self.seen) < DYNAMIC_WARMUP:
            return static
        q = float(np.quantile(np.asarray(self.seen), self.quantile))
        return min(self.config.max, max(self.config.min, q))


def _bin(confidence: float) -> int:
    return min(BINS, max(0, int(confidence * BINS)))
