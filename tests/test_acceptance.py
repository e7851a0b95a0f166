"""Acceptance math of route checks: unsure drafts verified, later confident ones held to the rollback rule."""
from __future__ import annotations

import numpy as np
import pytest

from tokenrouter_backend.core.acceptance import accept_greedy, accept_route, accept_speculative

DRAFTS = np.array([5, 6, 7])
CHOICES = np.array([5, 9, 7, 8])  # the heavy model prefers 9 where the light model drafted 6


def test_a_confident_draft_stands_unless_strongly_rejected():
    relaxed = np.array([False, True, False])
    v = accept_route(DRAFTS, relaxed, CHOICES, np.array([0.9, 0.3, 0.9]), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (3, 8, True)
    v = accept_route(DRAFTS, relaxed, CHOICES, np.array([0.9, 0.01, 0.9]), 0.05)
    assert (v.accepted, v.next_token, v.bonus) == (1, 9, False)


def test_an_unsure_draft_is_verified_as_in_verify_mode():
    probs = np.array([0.9, 0.3, 0.9])
    v = accept_route(DRAFTS, np.zeros(3, bool), CHOICES, probs, 0.05)
    assert v == accept_greedy(DRAFTS, CHOICES)
    # the unsure first draft must be the heavy model's choice even when the rest are confident
    v = accept_route(DRAFTS, np.array([False, True, True]), np.array([4, 6, 7, 8]), probs, 0.05)
    assert (v.accepted, v.next_token) == (0, 4)


def test_ending_where_the_heavy_model_ends_is_rejected_at_any_probability():
    v = accept_route(DRAFTS, np.array([False, True, True]), np.array([5, 2, 7, 8]), np.array([0.9, 0.6, 0.9]),
                     0.05, end_tokens=frozenset({2}))
    assert (v.accepted, v.next_token) == (1, 2)


@pytest.mark.parametrize("seed", range(40))
def test_sampled_checks_without_confident_drafts_are_speculative_sampling(seed):
    rng = np.random.default_rng(seed)
    d, vocab = 4, 12
    q = rng.dirichlet(np.ones(vocab), size=d)
    p = rng.dirichlet(np.ones(vocab), size=d + 1)
    drafts = np.array([rng.choice(vocab, p=q[i]) for i in range(d)])
    choices = np.array([int(np.argmax(row)) for row in p])
    probs = p[np.arange(d), drafts]
    got = accept_route(drafts, np.zeros(d, bool), choices, probs, 0.05, q=q, p=p, seed=seed, first_position=9)
    assert got == accept_speculative(drafts, q, p, seed, 9)
