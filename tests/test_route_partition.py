"""Route's text does not depend on how its drafts are cut into blocks.

Which light token stands unchecked, which one the heavy model verifies and where the heavy
model's own token goes are decided per token (the route gate on the token's own features,
the rollback rule, the token after a verified one is the heavy model's choice), so block
size and schedule change the number of calls, never the answer. The block schedule moves
with the server's measured costs and load, so this is what keeps route's answer to a prompt
from following them. Scripted toy models (``support.fakes``) make every forward exact; real
forwards of other shapes can still round a near tie differently (docs/route_quality.md).
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from support.fakes import VOCAB, FakeBranch, ToyLM
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.signals.learned_router import FEATURES, LearnedRouter
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.core.signals.token_classes import TokenClass

PROMPTS = [(1, 2, 3), (7, 7, 30, 4), (12, 5, 9, 21, 3, 3), (38, 1)]
BLOCKS = [dict(block_schedule="fixed", block_size=b) for b in (1, 2, 3, 5, 8)] + [
    dict(block_schedule="heuristic", block_size=4, max_block_size=8)]
PLAIN = ClassPolicy((1.0,) * len(TokenClass))  # the toy vocabulary has no classes but END


def route(prompt, blocks: dict, gate: RouteGate | None, **given) -> tuple[list[int], object, tuple[int, int]]:
    light, heavy = FakeBranch("light", ToyLM(seed=1, noise=0.7)), FakeBranch("heavy", ToyLM())
    params = RouterDefaults(heavy_first=False).request_params(
        {"router_mode": "route", "max_tokens": 48, "confidence_threshold": 0.5, **blocks, **given})
    out: list[int] = []
    request = GenerationRequest(prompt, params, end_id=VOCAB - 1, route_gate=gate)
    stats = asyncio.run(generate(request, light, heavy, lambda t, s, f: out.extend(t), session_id=3))
    assert not light.sessions and not heavy.sessions
    return out, stats, (light.calls, heavy.calls)


def per_token_router() -> LearnedRouter:
    """A router on the light model's own features only (confidence and margin)."""
    w = np.zeros(len(FEATURES))
    w[FEATURES.index("confidence_logit")], w[FEATURES.index("margin")] = -2.0, -1.0
    return LearnedRouter(w, 0.0, np.zeros(len(FEATURES)), np.ones(len(FEATURES)), 0.3)


@pytest.mark.parametrize("gate", [None, RouteGate(PLAIN, None, per_token_router())], ids=["confidence", "router"])
@pytest.mark.parametrize("rollback_threshold", [0.05, 0.3])
def test_route_text_is_the_same_for_every_block_schedule(gate, rollback_threshold):
    mixed = 0
    for prompt in PROMPTS:
        answers = [route(prompt, b, gate, rollback_threshold=rollback_threshold) for b in BLOCKS]
        texts = [a for a, _, _ in answers]
        assert all(t == texts[0] for t in texts), (prompt, texts)
        assert len({calls for _, _, calls in answers}) > 1, "the schedules should differ in their calls"
        s = answers[0][1]
        mixed += s.light_tokens > 0 and s.heavy_tokens > 0
    assert mixed >= 3, "the answers should mix unchecked light tokens and heavy tokens"
