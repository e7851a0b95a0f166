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

With a learned router the same two ideas move its bar on P(disagree) (``RouterParams``
``router_scale`` / ``router_threshold``, read by ``route_gate.router_bar``): the
conservative start multiplies the router's threshold by ``router_scale`` (< 1: stricter)
until the server has seen ``router_verdicts`` heavy verdicts; the dynamic threshold puts
the bar at the (1 - q)-quantile of the request's own router scores (so about q of its
drafts score above it and go to heavy), clipped to [router_min, router_max].
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.loop.hooks import BlockRecord
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterParams

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
    router_scale: float = 0.5  # learned router: its P(disagree) threshold x this during the start
    router_verdicts: int = 200  # ... until the server has seen this many heavy verdicts

    def __post_init__(self):
        if not 0.0 < self.router_scale <= 1.0:
            raise InvalidRequest(f"config parameter conservative_router_scale must be in (0, 1]; "
                                 f"got {self.router_scale}")
        if self.router_verdicts < 0:
            raise InvalidRequest(f"config parameter conservative_router_verdicts must be >= 0; "
                                 f"got {self.router_verdicts}")


@dataclass(frozen=True)
class DynamicConfig:
    """config.pbtxt parameters ``dynamic_threshold_<field>`` (quantile also per request)."""

    quantile: float = 0.0  # 0 = off
    min: float = 0.3  # dynamic threshold never below
    max: float = 0.99  # ... nor above
    router_min: float = 0.01  # learned router: dynamic P(disagree) bar never below
    router_max: float = 0.5  # ... nor above

    def __post_init__(self):
        if not 0.0 <= self.router_min <= self.router_max <= 1.0:
            raise InvalidRequest("config parameters dynamic_threshold_router_min / _router_max must satisfy "
                                 f"0 <= min <= max <= 1; got {self.router_min}, {self.router_max}")


class ConservativeStart:
    """Server-wide threshold floor that widens as agreement evidence accumulates."""

    def __init__(self, config: ConservativeConfig, target: float):
        self.config = config
        self.target = target
        self.threshold = max(config.start_threshold, target) if config.start else target
        self.checked = np.zeros(BINS + 1)  # verdicts per confidence bin
        self.disagreed = np.zeros(BINS + 1)
        self.verdicts = 0  # heavy verdicts seen (the learned router's start), counted up to router_verdicts

    def observe(self, record: BlockRecord) -> None:
        if self.config.start and self.verdicts < self.config.router_verdicts:
            self.verdicts += len(record.heavy_agree)
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

    @property
    def router_scale(self) -> float:
        """The learned router's threshold factor now: < 1 until enough verdicts are seen."""
        c = self.config
        return c.router_scale if c.start and self.verdicts < c.router_verdicts else 1.0


class DynamicThreshold:
    """Per-request: threshold = clipped q-quantile of the request's own light confidences."""

    def __init__(self, config: DynamicConfig, quantile: float):
        self.config, self.quantile = config, quantile
        self.seen: list[float] = []
        self.scores: list[float] = []  # the learned router's P(disagree) of its drafts

    def observe(self, record: BlockRecord) -> None:
        if self.quantile > 0:
            self.seen.extend(record.confidence)
            del self.seen[:-DYNAMIC_WINDOW]
            self.scores.extend(record.router_score)
            del self.scores[:-DYNAMIC_WINDOW]

    def threshold(self, static: float) -> float:
        if self.quantile <= 0 or len(self.seen) < DYNAMIC_WARMUP:
            return static
        q = float(np.quantile(np.asarray(self.seen), self.quantile))
        return min(self.config.max, max(self.config.min, q))


    def router_threshold(self, static: float) -> float:
        """The request's P(disagree) bar; ``static`` (the request's own, or -1: the router's)
        while off or before enough scores."""
        if self.quantile <= 0 or len(self.scores) < DYNAMIC_WARMUP:
            return static
        q = float(np.quantile(np.asarray(self.scores), 1.0 - self.quantile))
        return min(self.config.router_max, max(self.config.router_min, q))


def route_thresholds(params: RouterParams, conservative: ConservativeStart, dynamic: DynamicThreshold) -> RouterParams:
    """A route block's thresholds: confidence (dynamic, then the conservative floor) and the
    learned router's bar (dynamic P(disagree), else the request's ``router_threshold``; then
    the conservative scale)."""
    threshold = conservative.floor(dynamic.threshold(params.confidence_threshold))
    router_threshold, router_scale = dynamic.router_threshold(params.router_threshold), conservative.router_scale
    if (threshold, router_threshold, router_scale) == (params.confidence_threshold, params.router_threshold,
                                                       params.router_scale):
        return params
    return dataclasses.replace(params, confidence_threshold=threshold, router_threshold=router_threshold,
                               router_scale=router_scale)


def _bin(confidence: float) -> int:
    return min(BINS, max(0, int(confidence * BINS)))
