"""Route's heavy check: one heavy forward over everything the heavy model has not vouched for.

The forward scores the tokens committed unchecked since the last check (plus, at the end,
the ending tokens a stop rule cut off) and the block's drafts from its first unsure one.
The unchecked tokens are held to the rollback rule (BiLD): the first one the heavy model
strongly rejects, and all after it, is replaced by the heavy model's choice. If none is,
the drafts are judged per position by ``acceptance.verify`` (route's rule for light drafts
the gate saw, verify's for model-free drafts).
"""
from __future__ import annotations

from itertools import groupby

import numpy as np

from tokenrouter_backend.core.loop.acceptance import RouteRule, first_strong_rejection, heavy_own_positions, verify
from tokenrouter_backend.core.loop.block_notes import note_route_verdicts
from tokenrouter_backend.core.loop.drafts import Drafts
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.loop.routing_trace import Kind
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
from tokenrouter_backend.core.protocol.names import Source


async def heavy_check(state: RequestState, drafts: Drafts, sampled: bool, relaxed: np.ndarray | None = None) -> int:
    """Check the unchecked tokens and ``drafts``; returns the drafts accepted.

    ``sampled``: the heavy model returns distributions (speculative sampling; model-free
    drafts are a one-hot proposal). ``relaxed``: per draft, the route gate let it stand: a
    route block's check, decided per position by ``accept_route``; None: every draft is
    verified as in verify mode (model-free drafts, heavy-only steps)."""
    t, m = state.transcript, len(drafts)
    step = await state.heavy.step(state.tokens, extra=drafts.tokens, score_from=t.unvouched_from,
                                  sampling=state.sampling, return_dist=sampled)
    heavy, first_input = step.result, step.first_scored
    if state.noting:
        note_route_verdicts(state.note, heavy, first_input, len(state.tokens))
    accepted = 0
    if not rollback(state, list(state.tokens), heavy, first_input):
        rule = None if relaxed is None else RouteRule(relaxed, state.params.rollback_threshold,
                                                      state.request.end_tokens)
        verdict = verify(drafts, heavy, state.sampling.seed, len(state.tokens), rule)
        state.stats.verify_blocks += 1
        accepted = verdict.accepted
        state.route_context.observe(accepted, min(accepted + 1, m))
        source = drafts.source.token_source
        checked = Kind.COPIED if source == Source.NGRAM else Kind.LIGHT_VERIFIED
        for run, stood in _runs(drafts.tokens[:accepted], relaxed):
            t.commit(run, source, Kind.LIGHT_UNCHECKED if stood else checked)
        if verdict.next_token is not None:
            t.commit([verdict.next_token], Source.HEAVY)
        else:  # the light model drafts the next position: the next check must score it
            state.heavy.resend_from(len(state.tokens) - 1)
    t.mark_verified()
    t.clear_unvouched_tail()  # whatever ended the answer here, the heavy model saw it
    return accepted


async def vouch_end(state: RequestState) -> None:
    """The answer ended (end_id, stop string, max_tokens) on tokens the heavy model has not
    checked: one heavy forward checks them and the ending tokens; a rejection rolls back and
    the answer goes on."""
    t = state.transcript
    tail = list(t.unvouched_tail)
    step = await state.heavy.step(state.tokens, extra=tail, score_from=t.unvouched_from, sampling=state.sampling)
    rollback(state, state.tokens + tail, step.result, step.first_scored)
    t.mark_verified()
    t.clear_unvouched_tail()


def rollback(state: RequestState, seq: list[int], heavy: BranchResult, first_input: int) -> bool:
    """Roll back to the first unvouched token of ``seq`` (the committed tokens + cut-off
    ending tokens) the heavy model rejects, strongly or by ending there; its choice follows."""
    t = state.transcript
    start = max(t.verified_len, t.final_len, first_input + 1)
    lo, hi = start - first_input - 1, len(seq) - first_input - 1
    reject = first_strong_rejection(np.asarray(seq[start:]), heavy.tokens[lo:hi], heavy.input_probs[lo:hi],
                                    state.params.rollback_threshold, state.request.end_tokens)
    if reject is None:
        return False
    position = start + reject
    state.stats.rollbacks += 1
    state.stats.rolled_back_tokens += len(seq) - position
    t.rollback(seq, position, int(heavy.tokens[lo + reject]))
    return True


def _runs(tokens, relaxed: np.ndarray | None):
    """(tokens, stood unchecked) runs of accepted drafts: a draft the gate let stand went in
    under the rollback rule only, unless it sat where the heavy model's own token goes; any
    other was verified."""
    stood = None if relaxed is None else np.asarray(relaxed, bool) & ~heavy_own_positions(relaxed)
    flags = [] if stood is None else [bool(f) for f in stood[: len(tokens)]]
    flags += [False] * (len(tokens) - len(flags))
    i = 0
    for stood, group in groupby(flags):
        n = len(list(group))
        yield tokens[i: i + n], stood
        i += n
