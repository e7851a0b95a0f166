"""Request-level routing: prompt segments, their rule scores, and the A/B request arm's policy."""
from __future__ import annotations

import pytest

from tokenrouter_backend.core.names import Mode
from tokenrouter_backend.core.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.prompt_segments import MAX_SEGMENT_CHARS, SegmentKind, difficulty, score_prompt, segments
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
