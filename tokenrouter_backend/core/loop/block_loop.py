"""The block loop for one request: which branch produces each block of tokens.

    while not done:
        plan the block (hooks: block size, threshold, heavy-only steps)
        the request mode's strategy runs it (``modes/``):
            heavy | light : that branch generates the block itself (k tokens per call)
            verify        : light drafts <= k tokens; heavy scores them all in one forward;
                            the accepted prefix + heavy's own next token are committed
            route         : light drafts; confident tokens are committed unchecked; at the
                            first unsure one heavy checks everything it has not seen
            model-free    : (verify / route) where the text repeats itself, n-gram or
                            earlier-answer drafts are checked by one heavy forward
        the length rule; route vouches for an ending the heavy model has not seen
        emit the tokens no later rollback can touch (and no later stop string can cut)

The loop owns the order of things; the ``Transcript`` owns the tokens and cursors; proposers
(``proposers.py``) make ``Drafts``; ``acceptance.verify`` judges them. In verify and route a
streamed answer's heavy model prefills first and its first token is emitted at once, so the
first token comes no later than heavy-only's; a non-streamed answer's first heavy forward,
the prompt's prefill included, also checks the first light block. KV bookkeeping is
``branch_view.BranchView``. Framework-free: branches are ``Branch`` objects, output goes
through an ``emit`` callback.
"""
from __future__ import annotations

import time
from typing import Awaitable, Callable, Sequence

from tokenrouter_backend.core.loop.answer_cache import AnswerCache
from tokenrouter_backend.core.loop.block_notes import BlockNote, BlockStart, block_record
from tokenrouter_backend.core.loop.hooks import BlockHooks, BlockPlan
from tokenrouter_backend.core.loop.modes import Strategy, strategy_for
from tokenrouter_backend.core.loop.request_state import GenerationRequest, RequestState
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.loop.token_logprobs import OnLogprobs, final_logprobs, score_prompt
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.names import Mode, Source

__all__ = ["Emit", "GenerationRequest", "RequestCancelled", "generate"]

# emit(new_final_tokens, stats, finished) -> awaitable or None
Emit = Callable[[list, RequestStats, bool], "Awaitable[None] | None"]


class RequestCancelled(Exception):
    """The client cancelled or went away; the loop stopped between blocks."""


class BlockLoop:
    """Plans each block, hands it to its mode's strategy, and reports it."""

    def __init__(self, request: GenerationRequest, light: Branch, heavy: Branch, session_id: int | None = None,
                 hooks: BlockHooks | None = None, request_id: str = "", prior: Sequence[int] = ()):
        self.state = RequestState(request, light, heavy, session_id, prior, noting=hooks is not None)
        self.base_params = request.params  # what the request asked for; hooks may adjust per block
        self.hooks, self.request_id = hooks, request_id
        self._strategies: dict[Mode, Strategy] = {}

    @property
    def done(self) -> bool:
        return self.state.transcript.done

    async def run_block(self) -> None:
        s = self.state
        planned, before = s.params.mode, None
        if self.hooks is not None:
            plan = self.hooks.plan(self.base_params, s.block)
            self._take(plan)
            planned = plan.mode
            before = BlockStart.of(s.transcript.generated, s.stats, s.block)
            s.note = BlockNote()
            s.transcript.start_block()
        s.transcript.mode = s.params.mode
        strategy = self._strategy(s.params.mode)
        await strategy.block(s, planned)
        s.transcript.end_at_length(s.params.max_tokens)
        await strategy.after_block(s)
        if self.hooks is not None:
            self.hooks.after_block(block_record(self.request_id, s.note, s.stats, s.transcript, planned, before))

    def _take(self, plan: BlockPlan) -> None:
        """The plan's knobs for this block, and what it decided into the request's stats."""
        s, stats = self.state, self.state.stats
        s.params, s.block, s.free_drafts = plan.params, plan.block, plan.free_drafts
        if plan.light_estimate is not None:  # the latest decision: it is made again until the light model is in
            e = plan.light_estimate
            stats.light_plan_saving_ms, stats.light_plan_prefill_ms = e.saving_ms, e.prefill_ms
            stats.light_plan_acceptance, stats.light_plan_explored = e.acceptance, e.explore
            stats.light_plan_rest = e.rest
        if plan.degraded:
            stats.degraded_blocks += 1
            t = plan.params.confidence_threshold
            stats.degraded_threshold = min(stats.degraded_threshold, t) if stats.degraded_threshold else t

    def _strategy(self, mode: Mode) -> Strategy:
        if mode not in self._strategies:
            self._strategies[mode] = strategy_for(mode, self.state)
        return self._strategies[mode]

    def advance_final(self) -> list[int]:
        """Tokens that just became final (no rollback can reach them; they start at ``final_from``)."""
        self.final_from = self.state.transcript.final_len
        return self.state.transcript.advance_final(self.state.params.rollback_window)

    def finish_stats(self, started: float) -> RequestStats:
        st, t, mode = self.state, self.state.transcript, self.state.params.mode
        s = st.stats
        s.generated_tokens = t.generated
        s.light_tokens, s.heavy_tokens = t.count(Source.LIGHT), t.count(Source.HEAVY)
        s.ngram_tokens = t.count(Source.NGRAM)
        s.token_kinds = t.token_kinds()
        s.finish_reason, s.stop_trim_chars = t.finish_reason, t.stop_trim
        if mode == Mode.ROUTE:
            s.drafts_accepted = s.light_tokens
        s.light_skipped = mode in (Mode.VERIFY, Mode.ROUTE) and not st.light.opened
        s.total_ms = (time.perf_counter() - started) * 1e3
        s.router_overhead_ms = max(0.0, s.total_ms - s.light_ms - s.heavy_ms)
        s.queue_ms = st.request.queued_ms
        s.heavy_first_ms, s.light_first_ms = st.heavy.first_step_ms, st.light.first_step_ms
        s.light_start_ms = (st.light.opened_at - started) * 1e3 if st.light.opened else 0.0
        return s

    async def release(self) -> None:
        for view in (self.state.light, self.state.heavy):
            if view.opened:
                await view.branch.release(view.session_id)


async def generate(
    request: GenerationRequest,
    light: Branch,
    heavy: Branch,
    emit: Emit,
    is_cancelled: Callable[[], bool] = lambda: False,
    session_id: int | None = None,
    hooks: BlockHooks | None = None,
    request_id: str = "",
    answers: AnswerCache | None = None,
    on_logprobs: OnLogprobs | None = None,
    on_prompt_logprobs: OnLogprobs | None = None,
) -> RequestStats:
    """Run one request to completion, calling ``emit`` whenever tokens become final.

    ``emit(tokens, stats, finished)`` is called with finished=True exactly once, last.
    Both branch sessions are released whatever happens (error, cancellation). ``answers``
    (the decision cache) offers an earlier answer to the same prompt under the same cache
    salt as drafts and keeps this one. ``on_logprobs`` gets the log-probabilities of each emit's
    tokens just before it; ``on_prompt_logprobs`` the prompt's (``request.prompt_logprobs``),
    first. A ``score_only`` request emits no answer tokens.
    """
    started = time.perf_counter()
    p = request.params
    # greedy only: drafted from an earlier answer, a sampled answer would depend on the server's
    # history (same seed, other draws); greedy answers are identical either way
    use = answers is not None and p.answer_cache and p.ngram.enabled and p.temperature <= 0
    prior = answers.get(request.prompt, request.cache_salt) if use else ()
    loop = BlockLoop(request, light, heavy, session_id, hooks=hooks, request_id=request_id, prior=prior)
    try:
        if request.prompt_logprobs:
            scored = await score_prompt(loop.state)
            if on_prompt_logprobs is not None:
                on_prompt_logprobs(scored)
        if request.score_only:  # max_tokens 0: nothing to generate
            stats = loop.finish_stats(started)
            stats.finish_reason, stats.first_token_ms = "length", stats.total_ms
            await _maybe_await(emit([], stats, True))
            return stats
        while not loop.done:
            if is_cancelled():
                raise RequestCancelled("request cancelled by the client")
            await loop.run_block()
            if loop.done:
                break
            new = loop.advance_final()
            if new:
                if on_logprobs is not None:
                    on_logprobs(final_logprobs(loop.state, loop.final_from))
                if not loop.state.stats.first_token_ms:
                    loop.state.stats.first_token_ms = (time.perf_counter() - started) * 1e3
                t0 = time.perf_counter()
                await _maybe_await(emit(new, loop.state.stats, False))
                loop.state.stats.emit_ms += (time.perf_counter() - t0) * 1e3
        new = loop.advance_final()
        if on_logprobs is not None:
            on_logprobs(final_logprobs(loop.state, loop.final_from))
        stats = loop.finish_stats(started)
        if not stats.first_token_ms:
            stats.first_token_ms = stats.total_ms
        await _maybe_await(emit(new, stats, True))
        if answers is not None:
            answers.put(request.prompt, loop.state.transcript.answer, request.cache_salt)
        return stats
    finally:
        await loop.release()


async def _maybe_await(value) -> None:
    if value is not None:
        await value
