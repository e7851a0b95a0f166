"""Who proposes a block's drafts, behind one interface: ``propose`` then ``feedback``.

    light model      drafts token by token (one light forward each); q when sampling
    light copy       route, greedy: the light model reads an n-gram copy in one forward
                     (``light_copies.read_copy``) and drafts on where the check would look further
    lookup           model-free: an earlier answer to the prompt, or an n-gram copy
                     (``ngram.NgramDrafter``); no scores, a one-hot proposal

Each returns a ``Drafts`` (empty: nothing to propose, the caller falls back to the light
model). ``feedback`` tells the proposer how many of its drafts stood, so adaptive proposers
(the n-gram length and back-off) learn; the light model's block size is the loop's.
A constraint on tokens (a grammar's forced tokens) is one more proposer of this shape.
"""
from __future__ import annotations

from typing import Protocol

from tokenrouter_backend.core.loop.drafts import Drafts, DraftSource
from tokenrouter_backend.core.loop.light_copies import read_copy
from tokenrouter_backend.core.loop.ngram import NgramDrafter
from tokenrouter_backend.core.loop.request_state import RequestState


class Proposer(Protocol):
    async def propose(self, state: RequestState, room: int) -> Drafts: ...

    def feedback(self, drafts: Drafts, accepted: int) -> None: ...


class LightModel:
    """The light model's own drafts: up to ``room`` tokens, ending after the first one below
    ``draft_confidence_threshold``; their distributions when sampling."""

    async def propose(self, state: RequestState, room: int) -> Drafts:
        step = await state.light.step(state.tokens, draft_len=room,
                                      min_confidence=state.params.draft_confidence_threshold,
                                      sampling=state.sampling, return_dist=state.sampled)
        return Drafts.of_step(step)

    def feedback(self, drafts: Drafts, accepted: int) -> None:
        return None


class Lookup:
    """Model-free drafts: the earlier answer while this one follows it, else an n-gram copy,
    at most what the plan says pays (``free_drafts``). ``heavy_step``: for a planned
    heavy-only step (the ``heavy_steps`` knob decides)."""

    def __init__(self, drafter: NgramDrafter, heavy_step: bool = False):
        self.drafter, self.heavy_step = drafter, heavy_step

    async def propose(self, state: RequestState, room: int) -> Drafts:
        cap = room if state.free_drafts is None else min(room, state.free_drafts)
        tokens = self.drafter.propose(state.tokens, cap, self.heavy_step)
        return Drafts.of_tokens(tokens, self.drafter.source)

    def feedback(self, drafts: Drafts, accepted: int) -> None:
        self.drafter.update(len(drafts), accepted)


class LightCopy:
    """Route, greedy: where the text repeats, the light model reads the copy in one forward;
    its agreeing prefix and its choice after it are the drafts. When one of them is unsure (a
    heavy check follows), it drafts on to ``block`` drafts, as token-by-token drafting would
    have, so that the check looks as far ahead. Empty when there is no copy."""

    async def propose(self, state: RequestState, room: int) -> Drafts:
        copy = state.ngram.propose(state.tokens, state.remaining - 1, light=True)
        if not copy:
            return Drafts.none(DraftSource.COPY)
        p = state.params
        step = await state.light.step(state.tokens, extra=copy, score_from=len(state.tokens) - 1)
        drafts, agreed = read_copy(copy, step.result, p.draft_confidence_threshold)
        state.observe_draft(DraftSource.COPY, len(copy), agreed)
        state.ngram.update(len(copy), agreed)
        rest = min(room, state.remaining) - len(drafts)
        if rest > 0 and drafts.confidence[-1] >= p.draft_confidence_threshold \
                and state.decide(drafts).stand < len(drafts):
            more = await state.light.step(state.tokens + [int(t) for t in drafts.tokens], draft_len=rest,
                                          min_confidence=p.draft_confidence_threshold, sampling=state.sampling)
            drafts = drafts + Drafts.of_step(more)
        return drafts

    def feedback(self, drafts: Drafts, accepted: int) -> None:
        return None
