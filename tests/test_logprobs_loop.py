"""The block loop's answer log-probabilities (``GenerationRequest.logprobs``) on scripted
branches: verify carries the heavy model's numbers for every token, equal to heavy-only's;
route the light model's where a draft stood unchecked; scores upon a stale prefix are never used."""
from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from support.fakes import VOCAB, make_pair
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.token_logprobs import ScoreTable, answer_logprobs
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
from tokenrouter_backend.core.protocol.params import RouterDefaults

PROMPTS = [tuple(int(x) for x in np.random.default_rng(i).integers(0, VOCAB, size=3 + i % 5)) for i in range(8)]


def run(prompt, mode, logprobs=3, **given):
    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 24, **given})
    tokens, scored = [], []

    def emit(new, stats, finished):
        tokens.extend(int(t) for t in new)

    stats = asyncio.run(generate(GenerationRequest(prompt, params, logprobs=logprobs), light, heavy, emit,
                                 session_id=3, on_logprobs=scored.extend))
    assert [e.token for e in scored] == tokens  # one entry per emitted token, in order
    return tokens, scored, stats, heavy


def reference(heavy_lm, prompt, tokens, k):
    """The heavy model's raw log-softmax at each answer position (no cache)."""
    seq, out = list(prompt), []
    for t in tokens:
        z = heavy_lm.logits(seq).astype(np.float64)
        lsm = z - z.max() - np.log(np.exp(z - z.max()).sum())
        out.append((lsm[t], np.argsort(-lsm, kind="stable")[:k].tolist()))
        seq.append(t)
    return out


@pytest.mark.parametrize("mode", ["heavy", "verify"])
@pytest.mark.parametrize("block_size", [1, 4])
def test_verify_logprobs_are_the_heavy_models_and_equal_heavy_only(mode, block_size):
    for prompt in PROMPTS:
        tokens, scored, _, heavy = run(prompt, mode, block_size=block_size)
        assert all(e.branch == "heavy" for e in scored)
        ref = reference(heavy.lm, prompt, tokens, 3)
        np.testing.assert_allclose([e.logprob for e in scored], [lp for lp, _ in ref], atol=1e-5)
        assert [[t for t, _ in e.top] for e in scored] == [top for _, top in ref]
        if mode == "verify":
            base, base_scored, _, _ = run(prompt, "heavy", block_size=block_size)
            assert tokens == base
            np.testing.assert_allclose([e.logprob for e in scored], [e.logprob for e in base_scored], atol=1e-6)


def test_route_says_which_model_each_number_came_from():
    """A route token final before any heavy check (rollback_window 1) carries the light
    model's number; one the heavy model scored first, the heavy model's."""
    branches = set()
    for prompt in PROMPTS:
        light, heavy = make_pair()
        tokens, scored, stats, _ = run(prompt, "route", confidence_threshold=0.2, rollback_window=1)
        assert all(e.branch in ("heavy", "light") and math.isfinite(e.logprob) for e in scored)
        lms = {"light": light.lm, "heavy": heavy.lm}
        for name, lm in lms.items():
            ref = reference(lm, prompt, tokens, 1)
            mine = [(e.logprob, r[0]) for e, r in zip(scored, ref) if e.branch == name]
            np.testing.assert_allclose([a for a, _ in mine], [b for _, b in mine], atol=1e-5)
        branches |= {e.branch for e in scored}
    assert branches == {"heavy", "light"}


def test_no_logprobs_unless_asked():
    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 8})
    asyncio.run(generate(GenerationRequest(PROMPTS[0], params), light, heavy, lambda *a: None, session_id=3))
    assert all(op.logprobs == -1 for op in light.ops + heavy.ops)


def _result(tokens, lps, input_lps=()):
    f = np.asarray
    return BranchResult(tokens=f(tokens, np.int32), token_probs=np.ones(len(tokens), np.float32),
                        entropy=np.zeros(len(tokens), np.float32), input_probs=f(input_lps, np.float32),
                        session_len=0, token_logprobs=f(lps, np.float32), input_logprobs=f(input_lps, np.float32))


def test_a_score_made_upon_another_prefix_is_never_used():
    table = ScoreTable()
    # read 5 6 7 at positions 0-2, scored the last two inputs and drafted 8, 9: rows choose positions 2..4
    table.before_step([5, 6, 7])
    table.record(_result([1, 8, 9], [-0.1, -0.2, -0.3], [-0.5]), [5, 6, 7], first_scored=1, scored=2)
    entries = answer_logprobs([5, 6, 7, 8, 9], 2, 5, [("light", table)])
    assert [(e.token, e.logprob) for e in entries] == [(7, pytest.approx(-0.5)), (8, pytest.approx(-0.2)),
                                                       (9, pytest.approx(-0.3))]
    # the answer went 5 6 7 4 ...: position 4's score was made upon 8, not 4
    stale = answer_logprobs([5, 6, 7, 4, 9], 3, 5, [("light", table)])
    assert [e.branch for e in stale] == ["", ""] and all(math.isnan(e.logprob) for e in stale)
    table.before_step([5, 6, 7, 4])  # the next step reads the new prefix: the stale scores go
    assert sorted(table.scores) == [2, 3]
