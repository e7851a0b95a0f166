"""route mode: the light model commits what it is sure of; the heavy model checks the rest
where it is not (BiLD-style fallback and rollback), and vouches for the answer's ending.

    heavy first   a streamed answer's first token is the heavy model's, sent at once
    heavy-only    planned: a heavy check vouches for unchecked tokens first; with none, the
                  heavy model runs a whole block per call (model-free drafts first if planned)
    model-free    n-gram / earlier-answer drafts, checked with the unchecked tokens before them
    route         light drafts (or, greedy, the light model reading a copy); the gate
                  (``route_gate``) lets a confident prefix stand unchecked; from the first
                  unsure draft one heavy check decides (``route_check``)
    after         an answer that ended on unchecked tokens is checked once more; a rejection
                  reopens it
"""
from __future__ import annotations

import time

from tokenrouter_backend.core.loop.block_notes import BlockNote
from tokenrouter_backend.core.loop.block_size import next_block_size
from tokenrouter_backend.core.loop.drafts import Drafts, DraftSource
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.loop.modes.base import Drafting, branch_block
from tokenrouter_backend.core.loop.modes.route_check import heavy_check, vouch_end
from tokenrouter_backend.core.loop.proposers import LightCopy, LightModel
from tokenrouter_backend.core.loop.request_state import RequestState
from tokenrouter_backend.core.protocol.names import Mode, Source


class Route(Drafting):
    mode = Mode.ROUTE

    def __init__(self, state: RequestState):
        super().__init__(state)
        self.light, self.copy = LightModel(), LightCopy()

    async def check_model_free(self, state: RequestState, drafts: Drafts) -> int:
        return await heavy_check(state, drafts, sampled=state.sampled)

    async def after_block(self, state: RequestState) -> None:
        while state.transcript.needs_vouching:
            t0 = time.perf_counter()
            await vouch_end(state)
            state.stats.vouch_ms += (time.perf_counter() - t0) * 1e3
            state.transcript.end_at_length(state.params.max_tokens)

    async def heavy_block(self, state: RequestState) -> None:
        t = state.transcript
        if t.verified_len < len(t.tokens) or t.unvouched_tail:
            await heavy_check(state, Drafts.none(DraftSource.LIGHT), sampled=False)
            return
        await branch_block(state, state.heavy, Source.HEAVY)
        t.mark_verified()

    async def draft_block(self, state: RequestState) -> None:
        t = state.transcript
        k = min(state.block, state.remaining)
        drafts = Drafts.none(DraftSource.COPY) if state.sampled else await self.copy.propose(state, k)
        if not len(drafts):
            drafts = await self.light.propose(state, k)
        gate = state.decide(drafts)
        confident = gate.stand
        state.observe_draft(DraftSource.LIGHT, len(drafts), 0)  # route's accepted light drafts: its light tokens
        kept = t.commit(drafts.tokens[:confident], Source.LIGHT)
        unsure = drafts.tail(len(drafts) if t.done else confident)
        if state.noting:
            state.note = BlockNote(Action.FALLBACK if len(unsure) else Action.ACCEPT, drafted=drafts.tokens,
                                   confidence=drafts.confidence, entropy=drafts.entropy, committed_light=kept,
                                   gate=gate, acceptance=state.route_context.acceptance)
        accepted = confident
        if len(unsure):
            relaxed = gate.ok[confident: confident + len(unsure)]
            accepted += await heavy_check(state, unsure, sampled=state.sampled, relaxed=relaxed)
        state.block = next_block_size(state.params, state.block, len(drafts), accepted)
