"""Pure acceptance math: which drafted tokens stand, and the token that follows them.

Greedy verification (Leviathan et al. 2023, temperature 0): a draft token stands while it
equals the heavy model's argmax at its position; the heavy model's argmax after the last
standing token is the correction (or, if all stood, the bonus token). The result is
token-identical to heavy-only greedy decoding.

Speculative sampling (temperature > 0): draft x_i ~ q_i stands with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection the next token is drawn from
norm(max(0, p_i - q_i)); if all stand, the bonus is drawn from p_{d}. The output is
distributed exactly as sampling from the heavy model alone.

Route rollback (BiLD, Kim et al. 2023): among tokens the light model committed unchecked,
the first one the heavy model strongly rejects (not its choice, and given probability
below the rollback threshold) is replaced by the heavy choice and everything after it is
dropped. Ending is critical both ways: where the heavy model's own choice is to end (an
end token) and the light model went on, that position is rejected whatever the threshold.

One entry point, ``verify(drafts, heavy, sampling, first_position, rule)``, picks the rule
for any proposer's drafts: route's per-draft rule when ``rule`` is given, else greedy
verification when the heavy model returned no distributions, else speculative sampling
(model-free drafts are a one-hot proposal). Words: a draft is *accepted* when it stands; the
*correction* replaces the first rejected draft; the *bonus* follows a block that stood whole;
``Verdict.next_token`` is whichever of the two the heavy model supplies.

Route check (``accept_route``): a heavy check over a block's drafts from its first unsure
one judges each draft by the gate's own verdict on it: one the gate let stand is held to the
rollback rule (it stands unless strongly rejected), any other is verified as in verify mode.
A confident draft after an unsure one is thus held to the same rule as a confident draft
before it. The position right after a verified draft is the heavy model's own (its bonus
token: a block that ended at the verified draft would commit it there), and a check whose
last draft was not a verified one commits no token of its own: the light model drafts that
position next, as it would have had the block ended there. So every position is decided
by the same per-token rule however the drafts are cut into blocks: block size, schedule and
load do not change route's text, up to how forwards of other shapes round a near tie
(``tests/test_route_partition.py``, docs/route_quality.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.loop.drafts import Drafts
from tokenrouter_backend.core.loop.sampling import position_rng
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult

ACCEPT_STREAM = 1  # rng stream for acceptance draws (stream 0 = the branches' token draws)


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying a block of drafts."""

    accepted: int  # how many leading drafts stand
    next_token: int | None  # correction (first rejection) or bonus (all stood); None: none (a route check)
    bonus: bool = False  # every draft stood; next_token is the free extra token


@dataclass(frozen=True)
class RouteRule:
    """Route's per-draft rule for a check (``accept_route``)."""

    relaxed: np.ndarray  # bool [d]: the gate let the draft stand (held to the rollback rule only)
    rollback_threshold: float
    end_tokens: frozenset[int] = frozenset()


def verify(drafts: Drafts, heavy: BranchResult, seed: int, first_position: int,
           rule: RouteRule | None = None) -> Verdict:
    """Which of ``drafts`` stand, and the heavy model's token after them.

    ``heavy`` scored the position before each draft and the one after the last: its last
    ``d + 1`` returned positions. With distributions (``return_dist``) the drafts are judged
    by speculative sampling against their proposal ``drafts.q`` (one-hot when the proposer is
    deterministic); without, greedily against the heavy model's own choices.
    ``first_position``: the sequence position of drafts[0] (seeded draws are keyed by it)."""
    d = len(drafts)
    choices = heavy.tokens[-(d + 1):]
    p = None if heavy.dist is None else heavy.dist[-(d + 1):]
    if rule is not None:
        return accept_route(drafts.tokens, rule.relaxed, choices, heavy.input_probs[len(heavy.input_probs) - d:],
                            rule.rollback_threshold, rule.end_tokens, q=None if p is None else drafts.q, p=p,
                            seed=seed, first_position=first_position)
    if p is None:
        return accept_greedy(drafts.tokens, choices)
    q = drafts.q if drafts.q is not None else one_hot(drafts.tokens, p.shape[1])
    return accept_speculative(drafts.tokens, q, p, seed, first_position)


def one_hot(drafts, vocab: int) -> np.ndarray:
    """The proposal distribution of deterministic drafts: q[i] puts all mass on drafts[i]."""
    q = np.zeros((len(drafts), vocab), dtype=np.float32)
    q[np.arange(len(drafts)), np.asarray(drafts, dtype=np.int64)] = 1.0
    return q


def accept_greedy(drafts: np.ndarray, heavy_choices: np.ndarray) -> Verdict:
    """drafts [d]; heavy_choices [d + 1] = heavy argmax before each draft and after the last."""
    d = len(drafts)
    assert len(heavy_choices) == d + 1, "heavy must score every draft position plus one"
    mismatch = np.nonzero(np.asarray(drafts) != np.asarray(heavy_choices[:d]))[0]
    accepted = int(mismatch[0]) if mismatch.size else d
    return Verdict(accepted, int(heavy_choices[accepted]), bonus=accepted == d)


def accept_speculative(
    drafts: np.ndarray, q: np.ndarray, p: np.ndarray, seed: int, first_position: int
) -> Verdict:
    """drafts [d] sampled from q [d, V]; p [d + 1, V] the heavy's processed distributions.

    ``first_position`` is the sequence position of drafts[0]; draws are seeded by position
    so a result does not depend on batching or timing.
    """
    d = len(drafts)
    for i, x in enumerate(drafts):
        correction = _speculative_rejection(int(x), q[i], p[i], seed, first_position + i)
        if correction is not None:
            return Verdict(i, correction)
    return Verdict(d, _bonus_draw(p[d], seed, first_position + d), bonus=True)


def _speculative_rejection(x: int, q: np.ndarray, p: np.ndarray, seed: int, position: int) -> int | None:
    """One sampled draft x ~ q at ``position``: None if it stands (probability
    min(1, p(x)/q(x))), else the token drawn from the residual norm(max(0, p - q))."""
    rng = position_rng(seed, position, ACCEPT_STREAM)
    # qx > 0 since x was drawn from q
    if rng.random() * float(q[x]) <= float(p[x]):
        return None
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    # p == q up to rounding: any draw from p is exact
    return _draw(residual / total if total > 0 else p, rng)


def _bonus_draw(p: np.ndarray, seed: int, position: int) -> int:
    """The heavy model's own token after every draft stood (sampling)."""
    return _draw(p, position_rng(seed, position, ACCEPT_STREAM))


def accept_route(
    drafts: np.ndarray, relaxed: np.ndarray, heavy_choices: np.ndarray, heavy_probs: np.ndarray, threshold: float,
    end_tokens: frozenset[int] = frozenset(), q: np.ndarray | None = None, p: np.ndarray | None = None,
    seed: int = 0, first_position: int = 0,
) -> Verdict:
    """Route's check of drafts [d] (from a block's first unsure draft on).

    ``relaxed`` [d]: the drafts the route gate let stand; each stands unless the heavy model
    strongly rejects it (``first_strong_rejection``'s rule), and where it is rejected the
    heavy model's own choice follows. Every other draft is verified: greedy (``q`` None) it
    must be ``heavy_choices`` [d + 1] (the heavy model's choice before each draft and after
    the last), sampling it stands with probability min(1, p(x)/q(x)) and a rejection draws
    from the residual, as ``accept_speculative`` (``q`` [d, V], ``p`` [d + 1, V]).
    The position after a verified draft holds the heavy model's own token (its choice, or
    sampling its draw from ``p``): the draft there stands only if it is that token. The
    verdict's ``next_token`` is the correction at a rejection, the heavy model's token after
    a last draft that was verified, else None (nothing of the heavy model's own follows).
    ``heavy_probs`` [d]: the heavy model's probability of each draft.
    """
    d = len(drafts)
    assert len(heavy_choices) == d + 1 and len(heavy_probs) == d and len(relaxed) == d
    own_positions = heavy_own_positions(relaxed)
    for i, x in enumerate(drafts):
        x, choice = int(x), int(heavy_choices[i])
        if own_positions[i]:
            own = choice if q is None else _bonus_draw(p[i], seed, first_position + i)
            if x != own:
                return Verdict(i, own)
        elif relaxed[i]:
            if x != choice and (float(heavy_probs[i]) < threshold or choice in end_tokens):
                return Verdict(i, choice)
        elif q is None:
            if x != choice:
                return Verdict(i, choice)
        elif (correction := _speculative_rejection(x, q[i], p[i], seed, first_position + i)) is not None:
            return Verdict(i, correction)
    if not d or relaxed[-1] or own_positions[-1]:
        return Verdict(d, None)
    if q is None:
        return Verdict(d, int(heavy_choices[d]), bonus=True)
    return Verdict(d, _bonus_draw(p[d], seed, first_position + d), bonus=True)


def heavy_own_positions(relaxed) -> np.ndarray:
    """Per draft of a route check: it sits right after a verified draft, where the heavy
    model's own token goes (bool [d]). ``relaxed``: the drafts the gate let stand."""
    own = np.zeros(len(relaxed), bool)
    after_verified = False
    for i, stood in enumerate(relaxed):
        own[i] = after_verified
        after_verified = not after_verified and not stood
    return own


def _draw(dist: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(dist, dtype=np.float64)
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(dist) - 1)


def first_strong_rejection(
    committed: np.ndarray, heavy_choices: np.ndarray, heavy_probs_of_committed: np.ndarray, threshold: float,
    end_tokens: frozenset[int] = frozenset(),
) -> int | None:
    """Index of the first committed token the heavy model strongly rejects, else None.

    committed [u]: tokens the light model committed unchecked; heavy_choices [u]: the heavy
    model's own choice at each of those positions; heavy_probs_of_committed [u]: the
    probability the heavy model gave to the committed token there. A position where the
    heavy choice is one of ``end_tokens`` and the committed token differs is rejected
    whatever its probability.
    """
    choices = np.asarray(heavy_choices)
    differs = np.asarray(committed) != choices
    heavy_ends = np.isin(choices, list(end_tokens)) if end_tokens else np.zeros(len(choices), bool)
    rejected = differs & ((np.asarray(heavy_probs_of_committed) < threshold) | heavy_ends)
    idx = np.nonzero(rejected)[0]
    return int(idx[0]) if idx.size else None
