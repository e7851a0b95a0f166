"""The learned router's bar moves like the confidence threshold: conservative start, dynamic quantile."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from support.fakes import FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, run_one
from tokenrouter_backend.core.loop.hooks import Action, BlockRecord
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.signals.learned_router import FEATURES, LearnedRouter
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteContext, RouteGate, router_bar
from tokenrouter_backend.core.signals.token_classes import TokenClass
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.threshold_control import (
    DYNAMIC_WARMUP,
    ConservativeConfig,
    ConservativeStart,
    DynamicConfig,
    DynamicThreshold,
    route_thresholds,
)

ROUTE = RouterDefaults(mode="route", confidence_threshold=0.7)
LAX = ClassPolicy((1.0,) * len(TokenClass))


def record(agree=(), scores=(), confidence=()) -> BlockRecord:
    n = max(len(agree), len(scores), len(confidence))
    return BlockRecord("r", 0, "route", Action.VERIFY, n, tuple(range(n)), tuple(confidence) or (0.5,) * n,
                       (0.1,) * n, 0, tuple(agree), (0.5,) * len(agree), 0, 1, 0.0, 0.0, 0.0, 0.0, n,
                       router_score=tuple(scores))


def confidence_router(threshold: float) -> LearnedRouter:
    w = np.zeros(len(FEATURES))
    w[FEATURES.index("confidence")] = -4.0
    return LearnedRouter(w, 0.0, np.zeros(len(FEATURES)), np.ones(len(FEATURES)), threshold)


def test_conservative_start_scales_the_router_bar_until_enough_verdicts():
    start = ConservativeStart(ConservativeConfig(start=True, router_scale=0.25, router_verdicts=10), 0.8)
    assert start.router_scale == 0.25
    start.observe(record(agree=(True,) * 6))
    assert start.router_scale == 0.25  # 6 of 10
    start.observe(record(agree=(True, False, False, True)))  # disagreements count as verdicts too
    assert start.router_scale == 1.0
    assert ConservativeStart(ConservativeConfig(start=False, router_scale=0.25), 0.8).router_scale == 1.0
    assert ConservativeStart(ConservativeConfig(start=True, router_verdicts=0), 0.8).router_scale == 1.0


def test_dynamic_router_threshold_is_the_upper_quantile_of_the_request_scores():
    dyn = DynamicThreshold(DynamicConfig(router_min=0.0, router_max=1.0), 0.25)
    dyn.observe(record(scores=(0.1, 0.2, 0.3)))
    assert dyn.router_threshold(-1.0) == -1.0  # before the warm-up: the router's own bar ...
    assert dyn.router_threshold(0.3) == 0.3  # ... or the request's
    scores = np.linspace(0.02, 0.4, 20)
    dyn.observe(record(scores=tuple(scores)))
    seen = np.concatenate([[0.1, 0.2, 0.3], scores])
    assert dyn.router_threshold(-1.0) == pytest.approx(np.quantile(seen, 0.75))
    assert np.mean(seen > dyn.router_threshold(-1.0)) == pytest.approx(0.25, abs=0.05)  # ~q go to heavy
    clipped = DynamicThreshold(DynamicConfig(router_min=0.01, router_max=0.2), 0.25)
    clipped.observe(record(scores=tuple(scores)))
    assert clipped.router_threshold(-1.0) == 0.2
    off = DynamicThreshold(DynamicConfig(), 0.0)
    off.observe(record(scores=(0.3,) * (2 * DYNAMIC_WARMUP)))
    assert off.router_threshold(-1.0) == -1.0 and off.router_threshold(0.4) == 0.4


def test_route_thresholds_fill_the_params_and_the_gate_applies_them():
    params = ROUTE.request_params({"router_mode": "route"})
    start = ConservativeStart(ConservativeConfig(start=True, router_scale=0.5, router_verdicts=100), 0.7)
    dyn = DynamicThreshold(DynamicConfig(), 0.3)
    planned = route_thresholds(params, start, dyn)
    assert planned.router_scale == 0.5 and planned.router_threshold == -1.0
    router = confidence_router(threshold=0.05)
    assert router_bar(router, planned) == pytest.approx(0.025)
    gate = RouteGate(LAX, None, router)
    probs = np.array([0.99, 0.85, 0.2])  # P(disagree) = sigmoid(-4 p): 0.0187, 0.0323, 0.31
    args = (None, [1, 2, 3], probs, np.zeros(3), 0)
    assert gate.decide(*args, params, RouteContext(), frozenset()).stand == 2
    assert gate.decide(*args, planned, RouteContext(), frozenset()).stand == 1  # stricter during the start
    dyn.observe(record(scores=(0.01,) * DYNAMIC_WARMUP))
    later = route_thresholds(params, ConservativeStart(ConservativeConfig(), 0.7), dyn)
    assert later.router_threshold == 0.01 and later.router_scale == 1.0  # clipped to router_min
    assert gate.decide(*args, later, RouteContext(), frozenset()).stand == 0
    assert route_thresholds(params, ConservativeStart(ConservativeConfig(), 0.7),
                            DynamicThreshold(DynamicConfig(), 0.0)) is params  # nothing moves: unchanged


def test_a_request_sets_its_own_router_bar_which_the_start_scales_and_a_dynamic_bar_replaces():
    asked = ROUTE.request_params({"router_mode": "route", "router_threshold": 0.4})
    assert asked.router_threshold == pytest.approx(0.4)
    assert ROUTE.request_params({"router_mode": "route"}).router_threshold == -1.0  # not asked: the file's
    router = confidence_router(threshold=0.05)
    gate = RouteGate(LAX, None, router)
    probs = np.array([0.99, 0.85, 0.2])  # P(disagree) 0.0187, 0.0323, 0.31
    args = (None, [1, 2, 3], probs, np.zeros(3), 0)
    assert gate.decide(*args, asked, RouteContext(), frozenset()).stand == 3  # 0.31 <= 0.4
    zero = ROUTE.request_params({"router_mode": "route", "router_threshold": 0.0})
    assert gate.decide(*args, zero, RouteContext(), frozenset()).stand == 0
    start = ConservativeStart(ConservativeConfig(start=True, router_scale=0.5, router_verdicts=100), 0.7)
    held = route_thresholds(asked, start, DynamicThreshold(DynamicConfig(), 0.0))
    assert held.router_threshold == pytest.approx(0.4) and router_bar(router, held) == pytest.approx(0.2)
    dyn = DynamicThreshold(DynamicConfig(router_min=0.0, router_max=1.0), 0.5)
    dyn.observe(record(scores=(0.01,) * DYNAMIC_WARMUP))
    assert route_thresholds(asked, ConservativeStart(ConservativeConfig(), 0.7), dyn).router_threshold == 0.01


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_router_threshold_out_of_range_names_the_input(value):
    with pytest.raises(InvalidRequest, match=r"router_threshold must be (a number )?in \[0\.0, 1\.0\]"):
        ROUTE.request_params({"router_mode": "route", "router_threshold": value})


@pytest.mark.parametrize("params, message", [
    ({"conservative_router_scale": "0"}, r"conservative_router_scale must be in \(0, 1\]"),
    ({"conservative_router_scale": "1.5"}, r"conservative_router_scale must be in \(0, 1\]"),
    ({"conservative_router_verdicts": "-1"}, r"conservative_router_verdicts must be >= 0"),
    ({"dynamic_threshold_router_min": "0.6"}, r"dynamic_threshold_router_min / _router_max"),
    ({"dynamic_threshold_router_max": "2"}, r"dynamic_threshold_router_min / _router_max"),
])
def test_bad_router_threshold_config_names_the_key(params, message):
    with pytest.raises(InvalidRequest, match=message):
        Operations(params, ROUTE)


@dataclass
class Keep:
    """A request's hooks, plus a copy of its records."""

    hooks: object
    seen: list = field(default_factory=list)

    def plan(self, params, block):
        return self.hooks.plan(params, block)

    def after_block(self, r):
        self.seen.append(r)
        self.hooks.after_block(r)


def route_unchecked(ops: Operations, gate: RouteGate, prompts) -> tuple[int, int]:
    """(light drafts that stood unchecked, drafts scored) over route requests admitted by ``ops``."""
    stood = scored = 0
    for i, prompt in enumerate(prompts):
        adm = ops.admit(RequestInfo(f"q{i}", prompt, True), ROUTE.request_params({"router_mode": "route"}))
        keep = Keep(adm.hooks)
        run_one(prompt, FakeBranch("light", ToyLM(seed=2, noise=0.3, scale=4)), FakeBranch("heavy", ToyLM(scale=4)),
                hooks=keep, router_mode="route", max_tokens=32, route_gate=gate)
        blocks = [r for r in keep.seen if r.action in (Action.ACCEPT, Action.FALLBACK)]
        stood += sum(r.committed_light for r in blocks)
        scored += sum(len(r.router_score) for r in blocks)
    return stood, scored


def test_served_in_process_the_start_lets_fewer_drafts_stand_then_widens():
    gate = RouteGate(LAX, None, confidence_router(threshold=0.03))
    config = {"conservative_start": "true", "conservative_router_scale": "0.6", "conservative_router_verdicts": "400"}
    cold = Operations(config, ROUTE)
    first = route_unchecked(cold, gate, PROMPTS[:6])
    assert cold.conservative.router_scale < 1.0  # route fallbacks' verdicts accumulate ...
    route_unchecked(cold, gate, PROMPTS[6:30])
    assert cold.conservative.router_scale == 1.0  # ... until the start is over
    plain = route_unchecked(Operations({}, ROUTE), gate, PROMPTS[:6])
    assert first[1] and plain[1]
    assert first[0] / first[1] < plain[0] / plain[1]  # the same prompts: fewer stand while strict
