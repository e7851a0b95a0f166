"""Critical token classes and the route gate: rules before scores, a learned router on P(disagree)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import numpy as np
import pytest

from support.fakes import VOCAB, FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, Recorder
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.signals.learned_router import FEATURES, LearnedRouter, RouterFileError, feature_matrix
from tokenrouter_backend.core.signals.route_gate import DEFAULT_POLICY, ClassPolicy, RouteContext, RouteGate
from tokenrouter_backend.core.signals.token_classes import TokenClass, VocabClasses, base_class
from tokenrouter_backend.operations.route_setup import build_route_gate

# a toy vocabulary: ids 0-9 are digits, 10-14 operators, 15 "def", 16 newline, 17 "return", rest words
TEXTS = [str(i) for i in range(10)] + [" +", " ==", "<=", " %", "->", " def", "\n    ", " return"]
TEXTS += [f" w{i}" for i in range(VOCAB - len(TEXTS))]
END = VOCAB - 1


def test_base_classes_of_texts():
    expect = {"7": TokenClass.NUMBER, " 0.5": TokenClass.NUMBER, "1e-3": TokenClass.NUMBER, "0x1F": TokenClass.NUMBER,
              " ==": TokenClass.OPERATOR, "<=": TokenClass.OPERATOR, " **": TokenClass.OPERATOR,
              " if": TokenClass.LOGIC, "None": TokenClass.LOGIC, " foo": TokenClass.PLAIN, "x1": TokenClass.PLAIN,
              "\n": TokenClass.PLAIN}
    assert {t: base_class(t) for t in expect} == expect


def test_context_classes_definition_line_start_and_end():
    vocab = VocabClasses.from_texts(TEXTS)
    # " def" w20 | "\n    " return | "\n    " w21 | w22 END | 3
    drafts = [15, 20, 16, 17, 16, 21, 22, END, 3]
    got = [TokenClass(c) for c in vocab.classify(None, drafts, frozenset({END}))]
    assert got == [TokenClass.PLAIN, TokenClass.DEFINITION, TokenClass.PLAIN, TokenClass.LOGIC, TokenClass.PLAIN,
                   TokenClass.LINE_START, TokenClass.PLAIN, TokenClass.END, TokenClass.NUMBER]
    # the token before the drafts counts: after a newline, the first draft starts a line
    assert vocab.classify(16, [20], frozenset())[0] == TokenClass.LINE_START


def test_policy_from_config_defaults_and_errors():
    assert ClassPolicy.from_config({}).scales == tuple(DEFAULT_POLICY[c] for c in TokenClass)
    p = ClassPolicy.from_config({"critical_operator": "verify", "critical_plain": "0.9", "critical_end": ""})
    assert p.scales[TokenClass.OPERATOR] == math.inf and p.scales[TokenClass.PLAIN] == 0.9
    assert p.scales[TokenClass.END] == math.inf  # empty = default
    for bad in ("always", "-1", "11", "nan"):
        with pytest.raises(InvalidRequest, match=r"critical_number must be 'verify' or a scale in \[0, 10\]"):
            ClassPolicy.from_config({"critical_number": bad})


def route_records(gate: RouteGate | None, confidence_threshold: float = 0.3, prompts=PROMPTS[:12]):
    """Route requests on a confident toy pair that mostly agrees; every BlockRecord kept."""
    heavy_lm, light_lm = ToyLM(scale=4.0), ToyLM(scale=4.0, noise=0.5, seed=1)
    rec = Recorder()
    params = RouterDefaults().request_params({"router_mode": "route", "max_tokens": 40,
                                              "confidence_threshold": confidence_threshold})
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(tuple(prompt), params, end_id=END, route_gate=gate)
        asyncio.run(generate(request, FakeBranch("light", light_lm), FakeBranch("heavy", heavy_lm),
                             lambda t, s, f: None, hooks=rec, request_id=str(i)))
    return rec.records


def stood_classes(records) -> list[int]:
    """Classes of the drafts that were committed without a heavy check."""
    out = []
    for r in records:
        if r.action in (Action.ACCEPT, Action.FALLBACK):
            out += list(r.token_class[: r.committed_light])
    return out


def test_verify_classes_always_go_to_the_heavy_model():
    vocab = VocabClasses.from_texts(TEXTS)
    lax = RouteGate(dataclasses.replace(ClassPolicy(), scales=(1.0,) * len(TokenClass)), vocab)
    stood = stood_classes(route_records(lax))
    assert TokenClass.NUMBER in stood  # control: without the rule, confident numbers stand unchecked
    numbers_verified = ClassPolicy.from_config({"critical_number": "verify"})
    strict = stood_classes(route_records(RouteGate(numbers_verified, vocab)))
    assert strict and TokenClass.NUMBER not in strict and TokenClass.END not in strict


def test_default_numbers_need_twice_the_bar():
    """critical_number 2: under the confidence rule at 0.8 a number never stands (bar 1.6);
    under a learned router it stands only at half the router's P(disagree) bar."""
    assert ClassPolicy().scales[TokenClass.NUMBER] == 2.0 and ClassPolicy().scales[TokenClass.END] == math.inf
    params = RouterDefaults().request_params({"router_mode": "route"})
    assert params.confidence_threshold == 0.8
    vocab = VocabClasses.from_texts(TEXTS)
    drafts = [20, 3, 21]  # a word, the digit 3, a word
    certain = np.ones(3)
    rule = RouteGate(ClassPolicy(), vocab).decide(None, drafts, certain, np.zeros(3), 0, params, RouteContext(),
                                                  frozenset())
    assert rule.stand == 1  # even a certain number goes to the heavy model under the confidence rule
    router = router_on_confidence(threshold=0.2)  # P(disagree) = sigmoid(-4 p); words at 0.99: 0.019
    gate = RouteGate(ClassPolicy(), vocab, router)
    p_between = np.array([0.99, 0.4, 0.99])  # the number's P = 0.17: under 0.2, over 0.1
    p_low = np.array([0.99, 0.7, 0.99])  # P = 0.057: under 0.1
    assert gate.decide(None, drafts, p_between, np.zeros(3), 0, params, RouteContext(), frozenset()).stand == 1
    assert gate.decide(None, drafts, p_low, np.zeros(3), 0, params, RouteContext(), frozenset()).stand == 3
    plain = RouteGate(ClassPolicy((1.0,) * len(TokenClass)), vocab, router)
    assert plain.decide(None, drafts, p_between, np.zeros(3), 0, params, RouteContext(), frozenset()).stand == 3


def test_threshold_scale_raises_the_bar_of_one_class():
    vocab = VocabClasses.from_texts(TEXTS)
    base = (1.0,) * len(TokenClass)
    plain = RouteGate(ClassPolicy(base), vocab)
    harder = RouteGate(ClassPolicy(tuple(3.0 if c == TokenClass.OPERATOR else 1.0 for c in TokenClass)), vocab)
    # threshold 0.3 x 3 = 0.9 for operators: fewer of them stand
    n_plain = stood_classes(route_records(plain)).count(TokenClass.OPERATOR)
    n_hard = stood_classes(route_records(harder)).count(TokenClass.OPERATOR)
    assert n_hard < n_plain


def router_on_confidence(threshold: float, weight: float = -4.0) -> LearnedRouter:
    """A hand-set router: P(disagree) falls with the light confidence only."""
    w = np.zeros(len(FEATURES))
    w[FEATURES.index("confidence")] = weight
    return LearnedRouter(w, 0.0, np.zeros(len(FEATURES)), np.ones(len(FEATURES)), threshold)


def test_learned_router_decides_on_p_disagree():
    gate = RouteGate(ClassPolicy((1.0,) * len(TokenClass)), None, router_on_confidence(threshold=0.2))
    params = RouterDefaults().request_params({"router_mode": "route", "confidence_threshold": 0.99})
    probs = np.array([0.99, 0.9, 0.2, 0.99])  # sigmoid(-4 * p): 0.019, 0.027, 0.31, ...
    d = gate.decide(None, [1, 2, 3, 4], probs, np.zeros(4), 0, params, RouteContext(), frozenset())
    assert d.stand == 2  # confidence 0.9 < 0.99 would stop the plain rule at 0: the router decides
    assert np.allclose(d.scores, 1 / (1 + np.exp(4 * probs)))


def test_router_file_roundtrip_and_errors(tmp_path):
    router = router_on_confidence(0.3)
    path = tmp_path / "router.json"
    router.save(path)
    back = LearnedRouter.load(path)
    x = feature_matrix([0.5, 0.9], [1.0, 0.1], [0, 2], [0, 5], 0.7)
    assert np.allclose(back.p_disagree(x), router.p_disagree(x)) and back.threshold == 0.3
    d = json.loads(path.read_text())
    d["features"] = ["bogus"] + d["features"][1:]
    path.write_text(json.dumps(d))
    with pytest.raises(RouterFileError, match="router features must be distinct names"):
        LearnedRouter.load(path)
    d["features"] = d["features"][1:]  # known names, one fewer than the weights
    path.write_text(json.dumps(d))
    with pytest.raises(RouterFileError, match="one value per feature"):
        LearnedRouter.load(path)
    with pytest.raises(InvalidRequest, match="router_file"):
        build_route_gate({"router_file": "missing.json"}, None, tmp_path)
    router.save(path)
    gate = build_route_gate({"router_file": "router.json", "router_threshold": "0.1"}, TEXTS, tmp_path)
    assert gate.router.threshold == 0.1 and gate.vocab is not None
    with pytest.raises(InvalidRequest, match=r"router_threshold must be in \[0, 1\]"):
        build_route_gate({"router_file": "router.json", "router_threshold": "2"}, None, tmp_path)


def test_running_acceptance_feeds_the_records():
    records = route_records(RouteGate(ClassPolicy(), VocabClasses.from_texts(TEXTS)))
    by_request: dict[str, list[float]] = {}
    for r in records:
        if r.drafted:  # blocks without drafts (the heavy first token) carry no features
            by_request.setdefault(r.request_id, []).append(r.acceptance)
    # the prior at the first block; heavy verdicts move it later
    assert all(a[0] == pytest.approx(0.6) for a in by_request.values())
    assert any(len(set(a)) > 1 for a in by_request.values())
