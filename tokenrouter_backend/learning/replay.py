"""Predict route-mode behaviour from a verify-mode decision log (``tokenrouter replay LOG``).

In ``verify`` mode every light draft up to and including the first rejection has a heavy
verdict at the same prefix (the heavy model's own choice there, and the probability it
gave the light token). Replaying route's rule on those tokens, for a threshold t:

  confident  : confidence >= t and entropy <= entropy_threshold (committed unchecked)
  rolled back: confident, not heavy's choice, heavy prob < rollback_threshold (heavy replaces it)
  unsure     : the rest; heavy verifies them, so they stay light exactly when heavy agrees
  predicted light share = (confident and not rolled back) or (unsure and heavy agrees),
                          over all tokens with a verdict
  predicted agreement   = 1 - (light, not heavy's choice, not rolled back) over the same

Agreement means "the token is the heavy model's greedy choice given the text before it".
Assumptions (why real route runs differ): verdicts come from the heavy-greedy trajectory,
while route continues from its own text once it keeps a disagreement; tokens heavy
produced itself without a light draft (verify's bonus tokens) have no verdict and are
assumed to behave like the rest; a rollback in route needs a later heavy call, so a
disagreement at the very end of a request stays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from tokenrouter_backend.core.loop.hooks import Action, BlockRecord

DEFAULT_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99)
DEFAULT_ROLLBACK = 0.05  # RouterDefaults.rollback_threshold


@dataclass(frozen=True)
class Verdicts:
    confidence: np.ndarray
    entropy: np.ndarray
    agree: np.ndarray  # bool
    heavy_prob: np.ndarray  # nan when unknown

    def __len__(self) -> int:
        return len(self.agree)


@dataclass(frozen=True)
class Prediction:
    threshold: float
    light_share: float
    agreement: float
    rollback_rate: float  # fraction of tokens a route run would roll back
    tokens: int
    unchecked_share: float = 0.0  # light tokens committed and kept without a heavy check (heavy work saved)


def collect(records: Iterable[BlockRecord]) -> Verdicts:
    """Verdicts of greedy verify blocks (other blocks carry no complete verdicts)."""
    conf, ent, agree, prob = [], [], [], []
    for r in records:
        if r.action != Action.VERIFY:
            continue
        for v in r.verdicts():
            conf.append(v.confidence)
            ent.append(v.entropy)
            agree.append(v.agree)
            prob.append(v.heavy_prob)
    return Verdicts(np.asarray(conf, float), np.asarray(ent, float), np.asarray(agree, bool), np.asarray(prob, float))


def predict(v: Verdicts, threshold: float, entropy_threshold: float = math.inf,
            rollback_threshold: float = DEFAULT_ROLLBACK) -> Prediction:
    confident = (v.confidence >= threshold) & (v.entropy <= entropy_threshold)
    return predict_mask(v, confident, threshold, rollback_threshold)


def predict_mask(v: Verdicts, confident: np.ndarray, threshold: float,
                 rollback_threshold: float = DEFAULT_ROLLBACK) -> Prediction:
    """Route's prediction for any rule: ``confident`` marks the tokens committed unchecked."""
    n = len(v)
    if n == 0:
        return Prediction(threshold, 0.0, 1.0, 0.0, 0)
    wrong = confident & ~v.agree
    rolled = wrong & (np.nan_to_num(v.heavy_prob, nan=1.0) < rollback_threshold)
    kept_wrong = wrong & ~rolled
    light = (confident & ~rolled) | (~confident & v.agree)
    return Prediction(threshold, float(light.mean()), float(1.0 - kept_wrong.mean()), float(rolled.mean()), n,
                      float((confident & ~rolled).mean()))


def table(v: Verdicts, grid: Sequence[float], entropy_threshold: float, rollback_threshold: float) -> str:
    lines = [f"{len(v)} light tokens with a heavy verdict (verify-mode blocks)",
             f"{'threshold':>9}  {'light_share':>11}  {'agreement':>9}  {'rollbacks':>9}"]
    for t in grid:
        p = predict(v, t, entropy_threshold, rollback_threshold)
        lines.append(f"{t:>9.3f}  {p.light_share:>11.3f}  {p.agreement:>9.3f}  {p.rollback_rate:>9.3f}")
    return "\n".join(lines)
