"""What every block strategy is, and the steps several of them share.

A strategy runs one block of its mode against a ``RequestState``: ``block(state, planned)``
(``planned``: the mode the block was planned in — the request's own, or ``Mode.HEAVY``
when the cost model or load control suspends drafting), then ``after_block`` once the
length rule has applied (route vouches for its ending there). Strategies change the answer
only through ``state.transcript``.
"""
from __future__ import annotations

from tokenrouter_backend.core.loop.acceptance import Verdict, verify
from tokenrouter_backend.core.loop.block_notes import BlockNote
from tokenrouter_backend.core.loop.branch_view import BranchView
from tokenrouter_backend.core.loop.drafts import Drafts
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.loop.proposers import Lookup, Proposer
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
from tokenrouter_backend.core.protocol.names import Mode, Source


class Strategy:
    """One mode's blocks; ``after_block`` does nothing unless the mode needs it."""

    async def block(self, state: RequestState, planned: Mode) -> None:
        raise NotImplementedError

    async def after_block(self, state: RequestState) -> None:
        return None


class Drafting(Strategy):
    """The modes that draft (verify, route): a block is, in this order, the streamed
    heavy-first token, model-free drafts where the text repeats itself (or the plan allows
    them in a heavy-only step), a heavy-only block where the plan suspends drafting, else
    the mode's own drafting block. Subclasses say how each is checked or run."""

    mode: Mode

    def __init__(self, state: RequestState):
        self.lookup = {Mode.HEAVY: Lookup(state.ngram, heavy_step=True), self.mode: Lookup(state.ngram)}

    async def block(self, state: RequestState, planned: Mode) -> None:
        if planned == self.mode and heavy_first_due(state):
            return await heavy_first_token(state)
        lookup = self.lookup[planned]
        if (drafts := await model_free_drafts(state, lookup, planned)) is not None:
            accepted = await self.check_model_free(state, drafts)
            return model_free_checked(state, drafts, lookup, accepted)
        if planned == Mode.HEAVY:
            state.stats.heavy_only_blocks += 1
            return await self.heavy_block(state)
        await self.draft_block(state)

    async def check_model_free(self, state: RequestState, drafts: Drafts) -> int:
        """The heavy check of model-free drafts; returns how many stood."""
        raise NotImplementedError

    async def heavy_block(self, state: RequestState) -> None:
        raise NotImplementedError

    async def draft_block(self, state: RequestState) -> None:
        raise NotImplementedError


async def branch_block(state: RequestState, view: BranchView, source: Source, block: int | None = None) -> None:
    """The branch generates the block itself, ``block`` tokens per call (a streamed answer's
    first block is its first token alone: it is sent as soon as the prompt is prefilled)."""
    if block is None:
        block = 1 if state.params.stream and not state.transcript.generated else state.block
    step = await view.step(state.tokens, draft_len=min(block, state.remaining), sampling=state.sampling)
    state.transcript.commit(step.drafts, source)


def heavy_first_due(state: RequestState) -> bool:
    """verify / route, streamed: the heavy model prefills first and its first token goes out
    at once, before the light model is involved."""
    p = state.params
    return p.heavy_first and p.stream and not state.heavy.opened


async def heavy_first_token(state: RequestState) -> None:
    state.note = BlockNote(Action.HEAVY)
    await branch_block(state, state.heavy, Source.HEAVY, block=1)
    state.transcript.mark_verified()  # nothing unchecked precedes it


async def model_free_drafts(state: RequestState, lookup: Proposer, planned: Mode) -> Drafts | None:
    """This block's model-free drafts, if any: in a heavy-only step only once the prompt's
    first token went out and the plan allows some (``free_drafts``)."""
    if planned == Mode.HEAVY and not (state.free_drafts and state.heavy.opened):
        return None
    drafts = await lookup.propose(state, state.remaining - 1)
    return drafts if len(drafts) else None


async def check_exactly(state: RequestState, drafts: Drafts) -> tuple[Verdict, BranchResult]:
    """verify's rule: one heavy forward scores the last committed token (its verdict on draft 0)
    and every draft; the accepted prefix and the heavy model's token after it are committed
    (lossless). Returns the verdict and the heavy result."""
    t = state.transcript
    heavy = (await state.heavy.step(state.tokens, extra=drafts.tokens, score_from=len(state.tokens) - 1,
                                    sampling=state.sampling, return_dist=state.sampled)).result
    verdict = verify(drafts, heavy, state.sampling.seed, len(state.tokens))
    state.stats.verify_blocks += 1
    t.commit(drafts.tokens[:verdict.accepted], drafts.source.token_source)
    t.commit([verdict.next_token], Source.HEAVY)
    return verdict, heavy


def model_free_checked(state: RequestState, drafts: Drafts, lookup: Proposer, accepted: int) -> None:
    """After the heavy check of model-free drafts: count them, let the drafter learn, note it."""
    state.observe_draft(drafts.source, len(drafts), accepted)
    lookup.feedback(drafts, accepted)
    if state.noting:
        state.note = BlockNote(Action.NGRAM, ngram_drafted=len(drafts), ngram_accepted=accepted)
