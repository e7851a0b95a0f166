"""Request-level routing: prompt segments, their rule scores, and the A/B request arm's policy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.signals.prompt_segments import (
    MAX_SEGMENT_CHARS,
    SegmentKind,
    difficulty,
    score_prompt,
    segments,
)
from tokenrouter_backend.operations.ab import ARM_REQUEST, ARM_TOKEN, ab_bucket, request_key
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.request_policy import RequestPolicyConfig, decide


def test_segments_code_blocks_json_sentences_and_long_text():
    prompt = "Sort the list. Keep it stable!\n```python\nxs.sort()\n```\nThen print it"
    segs = segments(prompt)
    assert [s.kind for s in segs] == [SegmentKind.TEXT, SegmentKind.TEXT, SegmentKind.CODE, SegmentKind.TEXT]
    assert segs[2].text.startswith("```python") and segs[3].text == "Then print it"
    assert [s.kind for s in segments('{"a": [1, 2], "b": "x"}')] == [SegmentKind.JSON]
    long = segments("word " * 200)
    assert len(long) > 1 and all(len(s.text) <= MAX_SEGMENT_CHARS for s in long)


def test_difficulty_rules():
    assert difficulty("Write a friendly note to my neighbours") == 0.0
    assert difficulty("What is 17 * 23 exactly?") == pytest.approx(0.75)  # math + question + constraint
    assert difficulty("x", SegmentKind.CODE) == pytest.approx(0.35)
    assert difficulty("if (a == b) { return c; }") >= 0.35  # code markers in prose
    s = score_prompt("Hello there. How many primes are below 100? You must answer exactly.")
    assert s.segments == 3 and s.hardest >= 0.5 and s.critical_segments == 0


def test_policy_decisions():
    params = RouterDefaults().request_params({"router_mode": "route"})
    cfg = RequestPolicyConfig(policy=True)
    hard = decide(cfg, params, "Calculate 12 * 7 + 3. You must show exactly one number. What is it?")[0]
    assert hard.mode == Mode.VERIFY
    easy = decide(cfg, params, "Write a short friendly greeting for the club newsletter")[0]
    assert easy.mode == Mode.ROUTE and easy.confidence_threshold == cfg.easy_threshold
    middle = decide(cfg, params, "def add(a, b):\n    return (a + b)")[0]
    assert middle.mode == Mode.ROUTE and middle.confidence_threshold == params.confidence_threshold
    with pytest.raises(InvalidRequest, match=r"request_easy_max must be in \[0, 1\]"):
        RequestPolicyConfig(easy_max=2.0).check()


def test_ab_request_arm_runs_the_policy_token_arm_the_configured_mode():
    defaults = RouterDefaults(mode=Mode.ROUTE)
    config = {"ab_route_percent": "50", "request_policy": "true", "metrics": "false"}
    ops = Operations(config, defaults)
    params = defaults.request_params({})
    arms = {}
    for i in range(40):
        rid = f"req-{i}"
        text = "Calculate 3 * 4. You must answer exactly." if i % 2 else "Say hello to the club"
        info = RequestInfo(rid, (1, 2, 3), explicit_mode=False, prompt_text=text)
        adm = ops.admit(info, params)
        expect_arm = ARM_TOKEN if ab_bucket(request_key(rid, (1, 2, 3))) < 50 else ARM_REQUEST
        assert adm.arm == expect_arm
        arms.setdefault(adm.arm, []).append((i % 2, adm.params.mode, adm.params.confidence_threshold))
    assert all(mode == Mode.ROUTE and t == defaults.confidence_threshold for _, mode, t in arms[ARM_TOKEN])
    for hard, mode, t in arms[ARM_REQUEST]:
        assert (mode, t) == ((Mode.VERIFY, t) if hard else (Mode.ROUTE, 0.5))
    off = Operations({"ab_route_percent": "0", "metrics": "false"}, defaults)  # policy off: heavy-only arm
    assert off.admit(RequestInfo("x", (1,), False, prompt_text="hi"), params).params.mode == Mode.HEAVY


def test_segment_spans_and_token_nll_land_in_the_segment_of_their_last_character():
    from tokenrouter_backend.core.signals.prompt_segments import TokenSurprise, segment_nll, segment_spans, segments

    prompt = "Say hi.  Then count the apples: 3 + 4."
    segs = segments(prompt)
    spans = segment_spans(prompt, segs)
    assert [prompt[a:b] for a, b in spans] == [s.text for s in segs]
    # tokens: "Say", " hi.", "  Then", " count", " the", " apples:", " 3 + 4."
    texts = ["Say", " hi.", "  Then", " count", " the", " apples:", " 3 + 4."]
    nll = [float("nan"), 1.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    sums = segment_nll(prompt, segs, TokenSurprise.of(nll, texts))
    assert [s.text for s in segs] == ["Say hi.", "Then count the apples:", "3 + 4."]
    assert sums == [(1.0, 1), (20.0, 4), (10.0, 1)]


def test_perplexity_term_raises_difficulty_and_can_turn_route_into_verify():
    from tokenrouter_backend.core.signals.prompt_segments import PerplexityRule, TokenSurprise, score_prompt

    rule = PerplexityRule(nll_easy=1.0, nll_hard=3.0, weight=0.3)
    assert rule.term(0.5) == 0.0 and rule.term(2.0) == pytest.approx(0.15) and rule.term(9.0) == pytest.approx(0.3)
    assert rule.term(float("nan")) == 0.0
    prompt = "def add(a, b):\n    return a + b"
    texts = ["def", " add", "(a", ",", " b", "):\n", "    return", " a", " +", " b"]
    assert "".join(texts) == prompt
    plain = score_prompt(prompt)
    calm = score_prompt(prompt, TokenSurprise.of([float("nan")] + [0.2] * 9, texts), rule)
    surprised = score_prompt(prompt, TokenSurprise.of([float("nan")] + [5.0] * 9, texts), rule)
    assert calm.hardest == plain.hardest and calm.nll == pytest.approx(0.2) and calm.nll_tokens == 9
    assert surprised.hardest == pytest.approx(min(1.0, plain.hardest + 0.3)) and surprised.nll == pytest.approx(5.0)
    config = RequestPolicyConfig(policy=True)
    params = RouterDefaults(mode=Mode.ROUTE).request_params({})
    assert plain.hardest < config.hard_min <= surprised.hardest
    assert decide(config, params, prompt)[0].mode == Mode.ROUTE
    assert decide(config, params, prompt, TokenSurprise.of([float("nan")] + [5.0] * 9, texts))[0].mode == Mode.VERIFY


def test_perplexity_knobs_are_checked():
    for bad, match in ((dict(perplexity_tokens=-1), "request_perplexity_tokens"),
                       (dict(perplexity_chunk=0), "request_perplexity_chunk"),
                       (dict(nll_easy=3.0, nll_hard=3.0), "request_nll_easy"),
                       (dict(nll_weight=2.0), "request_nll_weight")):
        with pytest.raises(InvalidRequest, match=match):
            RequestPolicyConfig(**bad).check()


def test_measure_scores_every_prompt_token_in_chunks_and_releases_its_session():
    import asyncio

    from support.fakes import FakeBranch, ToyLM
    from tokenrouter_backend.core.protocol.branch_protocol import BranchOp
    from tokenrouter_backend.core.signals.prompt_surprise import measure

    light = FakeBranch("light", ToyLM(seed=1))
    prompt = tuple(range(3, 40))
    whole = asyncio.run(light.step(BranchOp(session_id=7, keep_len=0, input_ids=prompt, score_last=0)))
    reference = -np.log(whole.input_probs.astype(np.float64))  # NLL of prompt[1:], one forward
    light.sessions.clear()
    got = asyncio.run(measure(light, prompt, session_id=9, max_tokens=30, chunk_tokens=8))
    nan_at = {0, 8, 16, 24} | set(range(30, len(prompt)))  # first token, chunk starts, past max_tokens
    assert {i for i in range(len(prompt)) if np.isnan(got.nll[i])} == nan_at
    scored = [i for i in range(len(prompt)) if i not in nan_at]
    assert np.allclose(got.nll[scored], reference[np.asarray(scored) - 1], atol=1e-5)
    assert got.scored == len(scored) and got.mean == pytest.approx(float(np.mean(reference[np.asarray(scored) - 1])))
    assert light.sessions == {} and light.ops[-1].release and all(op.score_last == 0 for op in light.ops[1:-1])


def test_admission_measures_perplexity_only_for_requests_the_policy_decides():
    defaults = RouterDefaults(mode=Mode.ROUTE)
    ops = Operations({"ab_route_percent": "50", "request_policy": "true", "metrics": "false"}, defaults)
    for i in range(30):
        info = RequestInfo(f"r{i}", (1, 2), explicit_mode=False, prompt_text="x")
        assert ops.wants_surprise(info) == (ab_bucket(request_key(f"r{i}", (1, 2))) >= 50)
        assert not ops.wants_surprise(dataclasses.replace(info, explicit_mode=True))
    rules_only = Operations({"ab_route_percent": "0", "request_policy": "true", "request_perplexity_tokens": "0",
                             "metrics": "false"}, defaults)
    assert not rules_only.wants_surprise(RequestInfo("r", (1,), explicit_mode=False, prompt_text="x"))
