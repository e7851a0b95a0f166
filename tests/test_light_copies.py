"""Route's light copies: the light model reads an n-gram copy in one forward instead of
drafting it token by token — the same drafts, fewer light forwards."""
from __future__ import annotations

import numpy as np
import pytest
from test_block_loop import run
from test_ngram import copy_prompt

from support.fakes import make_pair
from tokenrouter_backend.core.loop.drafts import Drafts
from tokenrouter_backend.core.loop.light_copies import read_copy
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults


def scored(tokens, probs, margin=True):
    n = len(tokens)
    return BranchResult(np.asarray(tokens, np.int32), np.asarray(probs, np.float32),
                        np.linspace(0.1, 0.5, n, dtype=np.float32), np.zeros(0, np.float32), session_len=0,
                        margin=np.full(n, 0.3, np.float32) if margin else np.zeros(0, np.float32))


def test_read_copy_keeps_the_agreeing_prefix_and_the_choice_after_it():
    # position j: the light model's choice after j copied tokens
    drafts, agreed = read_copy([5, 6, 7, 8], scored([5, 6, 9, 8, 1], [0.9] * 5), 0.4)
    assert agreed == 2 and drafts.tokens.tolist() == [5, 6, 9]
    assert drafts.confidence.tolist() == pytest.approx([0.9] * 3)
    assert drafts.margin.tolist() == pytest.approx([0.3] * 3)
    # the whole copy agreed: the choice after its last token is the last draft
    drafts, agreed = read_copy([5, 6], scored([5, 6, 4], [0.9] * 3), 0.4)
    assert agreed == 2 and drafts.tokens.tolist() == [5, 6, 4]
    # disagreeing at once: the light model's own next token, one draft
    drafts, agreed = read_copy([5, 6], scored([3, 6, 4], [0.9] * 3), 0.4)
    assert agreed == 0 and drafts.tokens.tolist() == [3]


def test_read_copy_stops_after_an_unconfident_draft_as_drafting_does():
    drafts, agreed = read_copy([5, 6, 7], scored([5, 6, 7, 2], [0.9, 0.3, 0.9, 0.9]), 0.4)
    assert agreed == 3 and drafts.tokens.tolist() == [5, 6]  # the draft below 0.4 is the last
    assert read_copy([5], scored([5, 2], [0.9, 0.9], margin=False), 0.4)[0].margin is None
    with pytest.raises(ValueError, match="2 scored positions"):
        read_copy([5], scored([5, 2, 3], [0.9] * 3), 0.4)


def test_light_drafts_concatenate():
    a, _ = read_copy([5], scored([5, 2], [0.9, 0.8]), 0.4)
    b, _ = read_copy([1], scored([3, 4], [0.7, 0.6]), 0.4)
    both = a + b
    assert len(both) == 3 and both.tokens.tolist() == [5, 2, 3] and len(both.margin) == 3
    assert (a + Drafts(b.tokens, b.source, b.confidence, b.entropy, None)).margin is None


def own_copy_prompt(mode: str) -> tuple[int, ...]:
    """A prompt holding ``mode``'s own continuation of its last 3 tokens (the toy LM looks at
    3 tokens), so that the answer repeats the prompt."""
    base = tuple(int(t) for t in np.random.default_rng(3).integers(0, 40, 4))
    ref, _, _, _ = run(base, mode, max_tokens=40)
    return tuple(ref[:34]) + (1, 2, 5, 7) + tuple(ref[:3])


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_copies_change_no_token_and_save_light_forwards(threshold):
    """At threshold 0 route writes the light model's greedy answer, above 1 the heavy
    model's: either way a copy read in one forward must write exactly what token-by-token
    drafting writes, with fewer light forwards."""
    mode = "light" if threshold == 0 else "heavy"
    prompt = own_copy_prompt(mode)
    reference, _, _, _ = run(prompt, mode, max_tokens=30)
    runs = {}
    for copies in (True, False):
        light, heavy = make_pair()
        out, stats, _, _ = run(prompt, "route", light, heavy, max_tokens=30, confidence_threshold=threshold,
                               rollback_threshold=0.0, light_copies=copies)
        runs[copies] = (out, stats, light.forwards)
    (on, st_on, fw_on), (off, st_off, fw_off) = runs[True], runs[False]
    assert on == off == reference
    assert st_on.light_copy_blocks > 0 and st_on.light_copy_drafts_accepted >= 5
    assert st_on.light_copy_drafts_accepted <= st_on.light_copy_drafts_proposed
    assert st_off.light_copy_blocks == 0 and st_on.ngram_blocks == 0 and st_on.ngram_tokens == 0
    assert fw_on < fw_off
    assert st_on.generated_tokens == st_on.light_tokens + st_on.heavy_tokens


def test_copies_only_in_greedy_route_and_ngram_drafts_take_precedence():
    prompt = copy_prompt()
    _, sampled, _, _ = run(prompt, "route", max_tokens=30, temperature=0.5, random_seed=3)
    assert sampled.light_copy_blocks == 0
    _, heavy_checked, _, _ = run(prompt, "route", max_tokens=30, ngram_drafts=True)
    assert heavy_checked.ngram_blocks > 0 and heavy_checked.light_copy_blocks == 0
    _, verify, _, _ = run(prompt, "verify", max_tokens=30)
    assert verify.light_copy_blocks == 0


def test_light_copies_knob():
    assert RouterDefaults().request_params({"router_mode": "route"}).ngram.light_copies
    assert not RouterDefaults(light_copies=False).request_params({"router_mode": "route"}).ngram.light_copies
    assert not RouterDefaults().request_params({"router_mode": "route", "light_copies": False}).ngram.light_copies
    assert not RouterDefaults().request_params({"router_mode": "verify"}).ngram.light_copies
    with pytest.raises(InvalidRequest, match="light_copies"):
        RouterDefaults().request_params({"router_mode": "route", "light_copies": "yes"})
