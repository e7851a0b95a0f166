"""Acceptance math of route checks: unsure drafts verified, later confident ones held to the rollback rule."""
from __future__ import annotations

import numpy as np
import pytest

from tokenrouter_backend.core.loop.acceptance import (
    accept_greedy,
    accept_route,
    accept_speculative,
    heavy_own_positions,
)

DRAFTS = np.array([5, 6, 7])
CHOICES = np.array([5, 9, 7, 8])  # the heavy model prefers 9 where the light model drafted 6


def test_a_confident_draft_stands_unless_strongly_rejected():
    drafts, relaxed = np.array([5, 6, 7, 3]), np.array([False, True, True, True])
    choices = np.array([5, 6, 9, 3, 8])  # the heavy model prefers 9 where the light model drafted 7
    v = accept_route(drafts, relaxed, choices, np.array([0.9, 0.9, 0.3, 0.9]), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (4, None, False)  # ends on a relaxed draft: no token of its own
    v = accept_route(drafts, relaxed, choices, np.array([0.9, 0.9, 0.01, 0.9]), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (2, 9, False)


def test_the_position_after_a_verified_draft_is_the_heavy_models():
    # 6 is confident and the heavy model gives it 0.3, but a block ending at 5 would have
    # committed the heavy model's bonus token 9 there
    v = accept_route(DRAFTS, np.array([False, True, False]), CHOICES, np.array([0.9, 0.3, 0.9]), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (1, 9, False)
    v = accept_route(DRAFTS, np.array([False, True, False]), np.array([5, 6, 7, 8]), np.full(3, 0.9), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (3, 8, True)  # the last draft was verified: its bonus follows


def test_the_heavy_models_own_positions_follow_verified_drafts_only():
    relaxed = np.array([False, True, True, False, False, False, True])
    assert heavy_own_positions(relaxed).tolist() == [False, True, False, False, True, False, True]
    assert not heavy_own_positions(np.ones(4, bool)).any()


def test_an_unsure_draft_is_verified_as_in_verify_mode():
    probs = np.array([0.9, 0.3, 0.9])
    v = accept_route(DRAFTS, np.zeros(3, bool), CHOICES, probs, 0.05)
    assert v == accept_greedy(DRAFTS, CHOICES)
    # the unsure first draft must be the heavy model's choice even when the rest are confident
    v = accept_route(DRAFTS, np.array([False, True, True]), np.array([4, 6, 7, 8]), probs, 0.05)
    assert (v.accepted, v.next_token) == (0, 4)


def test_ending_where_the_heavy_model_ends_is_rejected_at_any_probability():
    v = accept_route(np.array([5, 6, 7, 3]), np.array([False, True, True, True]), np.array([5, 6, 2, 3, 8]),
                     np.array([0.9, 0.9, 0.6, 0.9]), 0.05, end_tokens=frozenset({2}))
    assert (v.accepted, v.next_token) == (2, 2)


def one_at_a_time(drafts, q, p, seed, first):
    """Sampled checks of one unsure draft each (blocks of one draft): a verdict per draft,
    the heavy model's draw right after an accepted one."""
    i = 0
    while i < len(drafts):
        v = accept_speculative(drafts[i:i + 1], q[i:i + 1], p[i:i + 2], seed, first + i)
        if v.accepted == 0:
            return i, v.next_token
        if i + 1 == len(drafts):
            return i + 1, v.next_token
        if int(drafts[i + 1]) != v.next_token:  # the draft after it must be the heavy model's draw
            return i + 1, v.next_token
        i += 2
    return len(drafts), None


@pytest.mark.parametrize("seed", range(40))
def test_sampled_checks_without_confident_drafts_are_checks_of_one_draft_each(seed):
    rng = np.random.default_rng(seed)
    d, vocab = 4, 12
    q = rng.dirichlet(np.ones(vocab), size=d)
    p = rng.dirichlet(np.ones(vocab), size=d + 1)
    drafts = np.array([rng.choice(vocab, p=q[i]) for i in range(d)])
    if seed % 2:  # every other case: the second draft is the heavy model's own draw after the first
        drafts[1] = accept_speculative(drafts[:1], q[:1], p[:2], seed, 9).next_token
    choices = np.array([int(np.argmax(row)) for row in p])
    probs = p[np.arange(d), drafts]
    got = accept_route(drafts, np.zeros(d, bool), choices, probs, 0.05, q=q, p=p, seed=seed, first_position=9)
    assert (got.accepted, got.next_token) == one_at_a_time(drafts, q, p, seed, 9)
