"""Task continuity: adjacent segments sharing a content word or identifier are scored as one group."""
from __future__ import annotations

import pytest

from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.signals.prompt_segments import (
    CRITICAL_LEVEL,
    SegmentKind,
    difficulty,
    groups,
    score_prompt,
    segments,
)
from tokenrouter_backend.core.signals.task_continuity import group_runs, link_keys
from tokenrouter_backend.operations.request_policy import RequestPolicyConfig, decide

PARAMS = RouterDefaults().request_params({"router_mode": "route"})
POLICY = RequestPolicyConfig(policy=True)


def members(prompt: str) -> list[list[int]]:
    return [list(g.members) for g in groups(segments(prompt))]


def test_link_keys_content_words_and_identifiers():
    assert link_keys("Please sort the Invoice rows by date.", code=False) == {"sort", "invoice", "rows", "date"}
    assert "must" not in link_keys("You must keep it short", code=False)  # constraint and stop words do not link
    assert {"parse_row", "x2", "xs"} <= link_keys("Call parse_row on x2 and `xs`.", code=False)
    code = link_keys("```python\ndef parse_row(line):\n    return line.split(',')\n```", code=True)
    assert code == {"python", "parse_row", "line", "split"}  # keywords and 1-2 letter names left out
    assert group_runs([frozenset({"a"}), frozenset({"a", "b"}), frozenset({"b"}), frozenset({"c"})]) == \
        [range(0, 3), range(3, 4)]
    assert group_runs([]) == []


def test_adjacent_segments_sharing_a_word_or_identifier_group_others_do_not():
    assert members("Hello there. How many primes are below 100? You must answer exactly.") == [[0], [1], [2]]
    assert members("Compute the invoice total for March. Which invoice rows count? Say hi. Thanks.") == \
        [[0, 1], [2], [3]]
    prompt = ("Fix this:\n```python\ndef parse_row(line):\n    return line.split(',')\n```\n"
              "Call parse_row on every line.")
    segs = segments(prompt)
    assert [s.kind for s in segs] == [SegmentKind.TEXT, SegmentKind.CODE, SegmentKind.TEXT]
    grouped = groups(segs)
    assert [list(g.members) for g in grouped] == [[0], [1, 2]]  # the code and the sentence naming its function
    assert grouped[1].kind == SegmentKind.CODE and "Call parse_row" in grouped[1].text
    assert members("Sort it. Sort it again. Then stop. Stop now.") == [[0, 1], [2, 3]]  # only neighbours chain


def test_a_split_hard_instruction_is_scored_whole():
    prompt = ("Calculate the shipping cost for each parcel. Each parcel cost must be rounded up. "
              "Thanks! Have a nice day.")
    segs = segments(prompt)
    assert [s.difficulty for s in segs] == pytest.approx([0.35, 0.25, 0.0, 0.0])  # each piece alone is mild
    grouped = groups(segs)
    assert [list(g.members) for g in grouped] == [[0, 1], [2], [3]]
    assert grouped[0].difficulty == pytest.approx(difficulty(segs[0].text + "\n" + segs[1].text)) == \
        pytest.approx(0.6)
    score = score_prompt(prompt)
    assert score.hardest == pytest.approx(0.6) and score.hardest >= CRITICAL_LEVEL and score.critical_segments == 2
    assert score.mean == pytest.approx(0.3) and (score.segments, score.groups) == (4, 3)
    assert decide(POLICY, PARAMS, prompt)[0].mode == Mode.VERIFY


def test_the_policy_sees_the_group_not_the_diluted_pieces():
    """Segment means: (0.35 + 0.15) / 4 = 0.125 would count as easy (route at the lax easy threshold);
    the invoice question continues the invoice task, so both pieces count at 0.5: mean 0.25."""
    prompt = "Compute the invoice total for March. Which invoice rows count? Say hi. Thanks."
    assert [s.difficulty for s in segments(prompt)] == pytest.approx([0.35, 0.15, 0.0, 0.0])
    score = score_prompt(prompt)
    assert score.mean == pytest.approx(0.25) and score.mean > POLICY.easy_max and score.whole < POLICY.hard_min
    params = decide(POLICY, PARAMS, prompt)[0]
    assert params.mode == Mode.ROUTE and params.confidence_threshold == PARAMS.confidence_threshold
    unrelated = "Compute the invoice total for March. Which colour do you like? Say hi. Thanks."
    assert score_prompt(unrelated).mean == pytest.approx(0.125)  # no shared word: pieces stay apart
    assert decide(POLICY, PARAMS, unrelated)[0].confidence_threshold == POLICY.easy_threshold
