"""verify mode: light drafts, the heavy model checks every draft in one forward (lossless:
token-identical to heavy-only greedy decoding, distributed as heavy-only sampling).

    heavy first   a streamed answer's first token is the heavy model's, sent at once
    heavy-only    planned by the cost model / load control: the heavy model runs the block
                  (model-free drafts first where the plan allows them)
    model-free    the text repeats itself: n-gram / earlier-answer drafts, no light forward
    verify        light drafts <= k; heavy scores them all; the accepted prefix and heavy's
                  own next token are committed; the block size adapts
"""
from __future__ import annotations

from tokenrouter_backend.core.loop.block_notes import BlockNote
from tokenrouter_backend.core.loop.block_size import next_block_size
from tokenrouter_backend.core.loop.drafts import Drafts, DraftSource
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.loop.modes.base import Drafting, branch_block, check_exactly
from tokenrouter_backend.core.loop.proposers import LightModel
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.protocol.names import Mode, Source


class Verify(Drafting):
    mode = Mode.VERIFY

    def __init__(self, state: RequestState):
        super().__init__(state)
        self.light = LightModel()

    async def check_model_free(self, state: RequestState, drafts: Drafts) -> int:
        verdict, _ = await check_exactly(state, drafts)
        return verdict.accepted

    async def heavy_block(self, state: RequestState) -> None:
        await branch_block(state, state.heavy, Source.HEAVY)

    async def draft_block(self, state: RequestState) -> None:
        k = min(state.block, state.remaining - 1)  # heavy adds one token of its own
        if k < 1:
            return await branch_block(state, state.heavy, Source.HEAVY)
        drafts = await self.light.propose(state, k)
        d = len(drafts)
        gate = state.decide(drafts) if state.noting else None  # before the commits: the gate reads the text before them
        verdict, heavy = await check_exactly(state, drafts)
        state.observe_draft(DraftSource.LIGHT, d, verdict.accepted)
        known = min(verdict.accepted + 1, d)  # drafts after the first rejection had another prefix
        if state.noting:
            state.note = BlockNote(Action.VERIFY, drafted=drafts.tokens, confidence=drafts.confidence,
                                   entropy=drafts.entropy, committed_light=verdict.accepted,
                                   heavy_agree=[i < verdict.accepted for i in range(known)],
                                   heavy_prob=heavy.input_probs[len(heavy.input_probs) - d:][:known],
                                   gate=gate, acceptance=state.route_context.acceptance)
        state.route_context.observe(verdict.accepted, known)
        state.block = next_block_size(state.params, state.block, d, verdict.accepted)
