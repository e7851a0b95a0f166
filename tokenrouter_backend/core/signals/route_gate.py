"""Route's per-token gate: which light drafts may stand without the heavy model.

A cascade per drafted token, cheapest first:

1. rules: the token's critical class (``token_classes``) under the class policy —
   ``verify`` sends it to the heavy model whatever the light model thinks; a number s
   scales that token's bar (confidence threshold x s, or router threshold / s);
2. the score: with a learned router (``learned_router``), P(heavy would disagree) must be
   <= the router threshold (``router_bar``: the file's or the request's dynamic one,
   scaled by the conservative start); without one, top-1 probability >= confidence_threshold,
   entropy <= entropy_threshold and margin >= margin_threshold (the plain confidence rule).

The drafts that stand are the leading run that passes; a heavy check of the rest holds each
later draft that passes to the rollback rule only, except right after a verified draft, where
the heavy model's own token goes (``acceptance.accept_route``).
``RouteGate`` is server-wide (built once from config.pbtxt ``critical_<class>`` and
``router_*`` parameters and the tokenizer's vocabulary); ``RouteContext`` is one request's
running acceptance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterParams
from tokenrouter_backend.core.signals.learned_router import LearnedRouter, feature_matrix
from tokenrouter_backend.core.signals.token_classes import TokenClass, VocabClasses

VERIFY = "verify"  # class policy value: always checked by the heavy model
MAX_SCALE = 10.0
# config.pbtxt critical_<class> defaults (docs/configuration.md)
DEFAULT_POLICY: dict[TokenClass, float] = {
    TokenClass.END: math.inf,  # end-of-answer decisions: always the heavy model
    # numbers: twice as hard a bar (confidence x 2 = never at the default 0.8; a learned
    # router's P(disagree) bar halved); docs/route_quality.md, "Critical token classes"
    TokenClass.NUMBER: 2.0,
    TokenClass.OPERATOR: 1.1,
    TokenClass.LOGIC: 1.1,
    TokenClass.DEFINITION: 1.1,
    TokenClass.LINE_START: 1.0,
    TokenClass.PLAIN: 1.0,
}
PRIOR_ACCEPTANCE = 0.6  # running acceptance before any heavy verdict ...
PRIOR_WEIGHT = 4.0  # ... worth this many verdicts


def parse_policy_value(key: str, text: str) -> float:
    """``verify`` -> inf; else a scale in [0, MAX_SCALE]; anything else names the key."""
    word = text.strip().lower()
    if word == VERIFY:
        return math.inf
    try:
        value = float(word)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_SCALE:
        raise InvalidRequest(f"config parameter {key} must be '{VERIFY}' or a scale in [0, {MAX_SCALE:g}]; "
                             f"got {text.strip()!r}")
    return value


@dataclass(frozen=True)
class ClassPolicy:
    """Per critical class: math.inf = always verify, else the scale of its bar."""

    scales: tuple[float, ...] = tuple(DEFAULT_POLICY[c] for c in TokenClass)

    @classmethod
    def from_config(cls, parameters: Mapping[str, str]) -> "ClassPolicy":
        scales = []
        for c in TokenClass:
            key = f"critical_{c.key}"
            text = parameters.get(key, "")
            scales.append(parse_policy_value(key, text) if text.strip() else DEFAULT_POLICY[c])
        return cls(tuple(scales))

    def array(self) -> np.ndarray:
        return np.asarray(self.scales, np.float64)


@dataclass
class RouteContext:
    """One request's heavy verdicts on drafts so far (the running-acceptance feature)."""

    agreed: int = 0
    checked: int = 0

    def observe(self, agreed: int, checked: int) -> None:
        self.agreed += agreed
        self.checked += checked

    @property
    def acceptance(self) -> float:
        return (self.agreed + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (self.checked + PRIOR_WEIGHT)


@dataclass(frozen=True)
class Decision:
    """The gate's answer for one block of drafts."""

    stand: int  # leading drafts that stand unchecked
    classes: np.ndarray  # int8 per draft
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))  # P(disagree) per draft (learned router)
    margin: np.ndarray | None = None  # light top-1 minus top-2 probability per draft; None = unknown
    ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per draft: the gate would let it stand

    def record_fields(self) -> dict:
        """The BlockRecord fields this decision fills (token_class, router_score, margin)."""
        margin = () if self.margin is None else tuple(round(float(x), 5) for x in self.margin)
        return {"token_class": tuple(int(c) for c in self.classes),
                "router_score": tuple(round(float(x), 5) for x in self.scores), "margin": margin}


def margin_ok(margin, params: RouterParams, n: int) -> np.ndarray:
    """The confidence rule's margin bar (``margin_threshold``; 0 = off): top-1 minus top-2
    probability >= the bar. An unknown margin (a light branch without the output) fails a set bar."""
    if params.margin_threshold <= 0:
        return np.ones(n, bool)
    if margin is None:
        return np.zeros(n, bool)
    return np.asarray(margin, np.float64) >= params.margin_threshold


def router_bar(router: LearnedRouter, params: RouterParams) -> float:
    """The P(disagree) bar in force for a request's block: the router file's (or the block's
    dynamic) threshold, times the conservative start's scale."""
    base = params.router_threshold if params.router_threshold >= 0 else router.threshold
    return base * params.router_scale


@dataclass(frozen=True)
class RouteGate:
    policy: ClassPolicy = ClassPolicy()
    vocab: VocabClasses | None = None  # None: only end tokens are told apart
    router: LearnedRouter | None = None

    def classify(self, previous: int | None, drafts: Sequence[int], end_tokens: frozenset[int]) -> np.ndarray:
        if self.vocab is not None:
            return self.vocab.classify(previous, drafts, end_tokens)
        return np.asarray([TokenClass.END if int(t) in end_tokens else TokenClass.PLAIN for t in drafts], np.int8)

    def scores(self, probs, entropy, classes: np.ndarray, first_position: int, acceptance: float,
               margin=None) -> np.ndarray:
        """P(disagree) per draft, or an empty array without a learned router."""
        if self.router is None or not len(classes):
            return np.zeros(0)
        positions = first_position + np.arange(len(classes))
        return self.router.p_disagree(feature_matrix(probs, entropy, classes, positions, acceptance, margin))

    def decide(self, previous: int | None, drafts: Sequence[int], probs, entropy, first_position: int,
               params: RouterParams, context: RouteContext, end_tokens: frozenset[int],
               margin=None) -> Decision:
        classes = self.classify(previous, drafts, end_tokens)
        scale = self.policy.array()[classes.astype(np.int64)]
        scores = self.scores(probs, entropy, classes, first_position, context.acceptance, margin)
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.router is not None:
                ok = scores <= router_bar(self.router, params) / scale
            else:
                ok = ((np.asarray(probs) >= params.confidence_threshold * scale)
                      & (np.asarray(entropy) <= params.entropy_threshold) & margin_ok(margin, params, len(scale)))
        ok &= np.isfinite(scale)
        bad = np.nonzero(~ok)[0]
        return Decision(int(bad[0]) if bad.size else len(ok), classes, scores,
                        None if margin is None else np.asarray(margin, np.float64), ok)
