"""The block loop for one request: which branch produces each block of tokens.

    while not done:
        heavy | light : that branch generates the block itself (k tokens per call)
        verify        : light drafts <= k tokens; heavy scores them all in one forward;
                        the agreeing prefix + heavy's own next token are committed
        n-gram        : (verify / route, when the text so far repeats itself) the tokens that
                        followed the last occurrence of the latest n tokens are checked by
                        one heavy forward — no light forward (``ngram.py``); route by
                        default has the light model read them instead, in one forward
                        (``light_copies.py``)
        route         : light drafts; confident tokens are committed unchecked; at the first
                        unconfident token heavy scores everything it has not seen, rolls
                        back to the first token it strongly rejects, verifies the unsure
                        drafts (later confident ones only need not be strongly rejected),
                        and supplies the token
        emit the tokens no later rollback can touch (and no later stop string can cut)

Which route drafts count as confident is ``route_gate.RouteGate`` (critical classes, learned
router). Route answers end on heavy-vouched tokens (``vouch_end``). Stop strings are matched on
the decoded text (``stop_text.py``).

In verify and route a streamed answer's heavy model prefills first and its first token is
emitted at once (``heavy_first``), so the first token comes no later than heavy-only's; the
light model prefills after it. A non-streamed answer is seen whole at its end: its first
heavy forward, the prompt's prefill included, also checks the first light block (one heavy
forward fewer per request). KV bookkeeping (what each session holds, chunked prefill, re-prefill)
is ``branch_view.BranchView``. Framework-free: branches are ``Branch`` objects, output goes
through an ``emit`` callback.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from itertools import groupby
from typing import Awaitable, Callable, Sequence

import numpy as np

from tokenrouter_backend.core import policy
from tokenrouter_backend.core.acceptance import (
    accept_greedy,
    accept_route,
    accept_speculative,
    first_strong_rejection,
    heavy_own_positions,
)
from tokenrouter_backend.core.answer_cache import AnswerCache
from tokenrouter_backend.core.block_notes import BlockNote, BlockStart, block_record, note_route_verdicts
from tokenrouter_backend.core.branch import Branch
from tokenrouter_backend.core.branch_protocol import BranchResult, Sampling
from tokenrouter_backend.core.branch_view import BranchView
from tokenrouter_backend.core.hooks import (
    ACTION_ACCEPT,
    ACTION_FALLBACK,
    ACTION_HEAVY,
    ACTION_NGRAM,
    ACTION_VERIFY,
    BlockHooks,
)
from tokenrouter_backend.core.light_copies import LightDrafts, read_copy
from tokenrouter_backend.core.names import HEAVY, LIGHT, NGRAM, Mode
from tokenrouter_backend.core.ngram import DraftSource, NgramDrafter, one_hot
from tokenrouter_backend.core.params import RouterParams
from tokenrouter_backend.core.prompt_surprise import PromptSurprise
from tokenrouter_backend.core.route_gate import Decision, RouteContext, RouteGate
from tokenrouter_backend.core.routing_trace import Kind, default_kind
from tokenrouter_backend.core.stats import RequestStats
from tokenrouter_backend.core.stop_text import StopText, first_stop
from tokenrouter_backend.core.stopping import StopCriteria

# emit(new_final_tokens, stats, finished) -> awaitable or None
Emit = Callable[[list, RequestStats, bool], "Awaitable[None] | None"]


class RequestCancelled(Exception):
    """The client cancelled or went away; the loop stopped between blocks."""


@dataclass(frozen=True)
class GenerationRequest:
    """One request as the core sees it (python scalars only)."""

    prompt: tuple[int, ...]
    params: RouterParams
    end_id: int | None = None
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # token level: the document-end tokens
    stop_text: StopText | None = None  # stop strings, matched on the decoded text
    route_gate: RouteGate | None = None  # critical classes / learned router; None = default policy
    prompt_surprise: PromptSurprise | None = None  # measured for request-level routing (reported in stats)

    @property
    def stop(self) -> StopCriteria:
        return StopCriteria(self.params.max_tokens, self.end_id, self.stop_sequences)

    @property
    def end_tokens(self) -> frozenset[int]:
        """Single tokens that end an answer (end_id, document ends)."""
        ends = {s[0] for s in self.stop_sequences if len(s) == 1}
        return frozenset(ends | ({self.end_id} if self.end_id is not None else set()))


class BlockLoop:
    """Request-scoped state and the per-mode block functions."""

    def __init__(self, request: GenerationRequest, light: Branch, heavy: Branch, session_id: int | None = None,
                 hooks: BlockHooks | None = None, request_id: str = "", prior: Sequence[int] = ()):
        self.request = request
        self.params = request.params
        self.base_params = request.params  # what the request asked for; hooks may adjust per block
        self.hooks = hooks
        self.request_id = request_id
        self._note = BlockNote()  # facts about the current block, for the BlockRecord
        self.stats = RequestStats(mode=str(self.params.mode), prompt_tokens=len(request.prompt))
        if request.prompt_surprise is not None and request.prompt_surprise.scored:
            self.stats.prompt_nll = request.prompt_surprise.mean
            self.stats.prompt_nll_tokens = request.prompt_surprise.scored
            self.stats.prompt_score_ms = request.prompt_surprise.elapsed_ms
        sid = session_id if session_id is not None else random.getrandbits(63)
        chunk = self.params.prefill_chunk_tokens
        self.light = BranchView(light, sid, self.stats, chunk, kv_window=self.params.light_kv_window)
        self.heavy = BranchView(heavy, sid, self.stats, chunk)
        self.tokens: list[int] = list(request.prompt)
        self.sources: list[str] = []  # branch of each generated token
        self.kinds: list[str] = []  # routing_trace.Kind of each generated token (--show-routing)
        self.low_water = 0  # with hooks: lowest generated index the current block rewrote from
        self.prompt_len = len(request.prompt)
        self.verified_len = self.prompt_len  # route: tokens the heavy model has vouched for
        self.final_len = self.prompt_len  # tokens no rollback can touch (streamable)
        self.block = self.params.block_size
        self.free_drafts: int | None = None  # the plan's cap on n-gram drafts (None: the drafter's own)
        # a stop sequence may start in tokens already generated: hold back len - 1 of them
        self.stop_holdback = max((len(s) - 1 for s in request.stop_sequences), default=0)
        self.done = False
        self.unvouched_tail: tuple[int, ...] = ()  # route: light's ending tokens cut off, unchecked
        self.sampling = Sampling(self.params.temperature, self.params.top_k, self.params.top_p, self.params.random_seed)
        self.ngram = NgramDrafter(self.params.ngram, prior, self.prompt_len)
        self.stats.answer_cache_hit = bool(prior) and self.params.ngram.enabled
        self.gate = request.route_gate or RouteGate()
        self.route_context = RouteContext()  # running acceptance (a learned-router feature)

    # ---- committing -------------------------------------------------------------------
    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - self.generated

    def commit(self, new, source: str, kind: Kind | None = None) -> int:
        """Append tokens from ``source``; apply stop rules; returns how many stayed."""
        if self.done:
            return 0
        start = self.generated
        self.tokens.extend(int(t) for t in new)
        self.sources.extend([source] * len(new))
        self.kinds.extend([kind or default_kind(source, self.params.mode)] * len(new))
        generated = self.tokens[self.prompt_len :]
        stop = first_stop(generated, start, self.request.stop, self.request.stop_text,
                          min_keep=self.final_len - self.prompt_len)
        if stop is not None:
            self.unvouched_tail = tuple(generated[stop.keep : stop.tail_end])
            self._truncate(self.prompt_len + stop.keep)
            self.done = True
            self.stats.finish_reason = stop.reason
            self.stats.stop_trim_chars = stop.trim
        return self.generated - start

    def _reopen(self) -> None:
        """A heavy check rejected the ending: the answer goes on."""
        self.done = False
        self.unvouched_tail = ()
        self.stats.finish_reason = ""
        self.stats.stop_trim_chars = 0

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]
        del self.sources[length - self.prompt_len :]
        del self.kinds[length - self.prompt_len :]
        self.low_water = min(self.low_water, length - self.prompt_len)

    # ---- modes ------------------------------------------------------------------------
    async def single_branch_block(self, view: BranchView, source: str, block: int | None = None) -> None:
        """heavy / light mode: the branch drafts the whole block itself (a streamed answer's
        first block is its first token alone: it is sent as soon as the prompt is prefilled)."""
        if block is None:
            block = 1 if self.params.stream and not self.generated else self.block
        k = min(block, self.remaining)
        step = await view.step(self.tokens, draft_len=k, sampling=self.sampling)
        self.commit(step.drafts, source)

    async def heavy_first_token(self) -> None:
        """verify / route, before the light model is involved: heavy prefills the prompt and
        its first token is committed (and emitted) at once."""
        self._note = BlockNote(ACTION_HEAVY)
        await self.single_branch_block(self.heavy, HEAVY, block=1)
        self.verified_len = len(self.tokens)  # nothing unchecked precedes it

    async def route_heavy_block(self) -> None:
        """route, heavy-only steps planned: a heavy check vouches for any unchecked light
        tokens first; with none, the heavy model runs a whole block per call, as in heavy mode."""
        if self.verified_len < len(self.tokens) or self.unvouched_tail:
            await self.heavy_check([], None)
            return
        await self.single_branch_block(self.heavy, HEAVY)
        self.verified_len = len(self.tokens)

    async def verify_block(self) -> None:
        """Light drafts, heavy checks all drafts in one forward (lossless)."""
        k = min(self.block, self.remaining - 1)  # heavy adds one token of its own
        if k < 1:
            return await self.single_branch_block(self.heavy, HEAVY)
        want_dist = not self.sampling.greedy
        lstep = await self.light.step(
            self.tokens, draft_len=k, min_confidence=self.params.draft_confidence_threshold,
            sampling=self.sampling, return_dist=want_dist,
        )
        lres, drafts = lstep.result, lstep.drafts
        d = len(drafts)
        # heavy scores the last committed token (its verdict on draft 0) and every draft
        hres = (await self.heavy.step(self.tokens, extra=drafts, score_from=len(self.tokens) - 1,
                                      sampling=self.sampling, return_dist=want_dist)).result
        # heavy's choice before each draft and after the last one: the last d + 1 positions
        if want_dist:
            verdict = accept_speculative(
                drafts, lres.dist[-d:], hres.dist[-(d + 1) :], self.sampling.seed, len(self.tokens)
            )
        else:
            verdict = accept_greedy(drafts, hres.tokens[-(d + 1) :])
        self.stats.verify_blocks += 1
        self.stats.drafts_proposed += d
        self.stats.drafts_accepted += verdict.accepted
        known = min(verdict.accepted + 1, d)  # drafts after the first rejection had another prefix
        if self.hooks is not None:
            self._note = BlockNote(ACTION_VERIFY, drafted=drafts, confidence=lstep.draft_probs,
                                   entropy=lstep.draft_entropy, committed_light=verdict.accepted,
                                   heavy_agree=[i < verdict.accepted for i in range(known)],
                                   heavy_prob=hres.input_probs[len(hres.input_probs) - d :][:known],
                                   gate=self._gate(lstep), acceptance=self.route_context.acceptance)
        self.route_context.observe(verdict.accepted, known)
        self.commit(drafts[: verdict.accepted], LIGHT)
        self.commit([verdict.next_token], HEAVY)
        self.block = policy.next_block_size(self.params, self.block, d, verdict.accepted)

    async def route_block(self) -> None:
        """Light commits what it is sure of; heavy checks the rest where it is not (BiLD).

        Confident drafts (top-1 prob >= confidence_threshold, entropy <= entropy_threshold)
        are committed unchecked. If any draft is unsure, one heavy forward scores everything
        it has not seen: the unchecked tokens (rollback to the first one it strongly
        rejects) and the unsure drafts (verified exactly as in verify mode). Where the text
        repeats earlier text, the light model reads the copy instead of drafting it
        (``light_copies.py``).
        """
        p = self.params
        k = min(self.block, self.remaining)
        want_dist = not self.sampling.greedy
        copy = self.ngram.propose(self.tokens, self.remaining - 1, light=True) if not want_dist else []
        if copy:
            light = await self.light_copy_drafts(copy, k)
        else:
            light = LightDrafts.of(await self.light.step(
                self.tokens, draft_len=k, min_confidence=p.draft_confidence_threshold,
                sampling=self.sampling, return_dist=want_dist,
            ))
        drafts = light.drafts
        gate = self._gate(light)
        confident = gate.stand
        self.stats.drafts_proposed += len(drafts)
        kept = self.commit(drafts[:confident], LIGHT)
        unsure = drafts[confident:] if not self.done else drafts[:0]
        if self.hooks is not None:
            self._note = BlockNote(ACTION_FALLBACK if len(unsure) else ACTION_ACCEPT, drafted=drafts,
                                   confidence=light.draft_probs, entropy=light.draft_entropy,
                                   committed_light=kept, gate=gate, acceptance=self.route_context.acceptance)
        accepted = confident
        if len(unsure):
            q = light.dist[-len(unsure) :] if want_dist else None
            accepted += await self.heavy_check(unsure, q, relaxed=gate.ok[confident : confident + len(unsure)])
        self.block = policy.next_block_size(p, self.block, len(drafts), accepted)

    async def light_copy_drafts(self, copy: list[int], k: int) -> LightDrafts:
        """route, greedy: the light model reads ``copy`` in one forward; its agreeing prefix
        and its choice after it are the drafts. When one of them is unsure (a heavy check
        follows), the light model drafts on to the block's ``k`` drafts, as token-by-token
        drafting would have, so that the check looks as far ahead."""
        p = self.params
        step = await self.light.step(self.tokens, extra=copy, score_from=len(self.tokens) - 1)
        light, agreed = read_copy(copy, step.result, p.draft_confidence_threshold)
        self.stats.light_copy_blocks += 1
        self.stats.light_copy_drafts_proposed += len(copy)
        self.stats.light_copy_drafts_accepted += agreed
        self.ngram.update(len(copy), agreed)
        rest = min(k, self.remaining) - len(light)
        if rest > 0 and light.draft_probs[-1] >= p.draft_confidence_threshold \
                and self._gate(light).stand < len(light):
            more = await self.light.step(self.tokens + [int(t) for t in light.drafts], draft_len=rest,
                                         min_confidence=p.draft_confidence_threshold, sampling=self.sampling)
            light = light + LightDrafts.of(more)
        return light

    async def heavy_check(self, unsure, q, want_dist: bool | None = None, source: str = LIGHT,
                          relaxed: np.ndarray | None = None) -> int:
        """One heavy forward over unchecked tokens + unsure drafts; returns drafts accepted.

        ``q``: the drafts' proposal distributions (speculative sampling); None with
        ``want_dist`` set means deterministic drafts (n-gram): a one-hot q. ``relaxed``: per
        draft, the route gate let it stand: a route block's check, decided per position by
        ``accept_route`` (a relaxed draft is held to the rollback rule, the draft after a
        verified one must be the heavy model's own token); None: every draft is verified as
        in verify mode (n-gram drafts, heavy-only steps)."""
        want_dist = q is not None if want_dist is None else want_dist
        step = await self.heavy.step(self.tokens, extra=unsure, score_from=self._unvouched_from(),
                                     sampling=self.sampling, return_dist=want_dist)
        hres, first_input = step.result, step.first_scored
        m = len(unsure)
        if self.hooks is not None:
            note_route_verdicts(self._note, hres, first_input, len(self.tokens))
        accepted = 0
        if not self._rollback(list(self.tokens), hres, first_input):
            if relaxed is not None:
                verdict = accept_route(
                    unsure, relaxed, hres.tokens[-(m + 1) :], hres.input_probs[len(hres.input_probs) - m :],
                    self.params.rollback_threshold, self.request.end_tokens, q=q if want_dist else None,
                    p=hres.dist[-(m + 1) :] if want_dist else None, seed=self.sampling.seed,
                    first_position=len(self.tokens))
            elif want_dist:
                q = one_hot(unsure, hres.dist.shape[1]) if q is None else q
                verdict = accept_speculative(unsure, q, hres.dist[-(m + 1) :], self.sampling.seed, len(self.tokens))
            else:
                verdict = accept_greedy(unsure, hres.tokens[-(m + 1) :])
            self.stats.verify_blocks += 1
            accepted = verdict.accepted
            self.route_context.observe(accepted, min(accepted + 1, m))
            checked = Kind.LIGHT_VERIFIED if source == LIGHT else Kind.COPIED
            for run, stood in _runs(unsure[:accepted], relaxed):
                self.commit(run, source, Kind.LIGHT_UNCHECKED if stood else checked)
            if verdict.next_token is not None:
                self.commit([verdict.next_token], HEAVY)
            else:  # the light model drafts the next position: the next check must score it
                self.heavy.resend_from(len(self.tokens) - 1)
        self.verified_len = len(self.tokens)
        self.unvouched_tail = ()  # whatever ended the answer here, the heavy model saw it
        return accepted

    async def ngram_block(self, mode: Mode, drafts: list[int]) -> None:
        """n-gram drafts checked by one heavy forward: verify as light drafts are (lossless),
        route as unsure drafts (with the unchecked tokens before them)."""
        d, want_dist = len(drafts), not self.sampling.greedy
        if mode == Mode.ROUTE:
            accepted = await self.heavy_check(drafts, None, want_dist=want_dist, source=NGRAM)
        else:
            hres = (await self.heavy.step(self.tokens, extra=drafts, score_from=len(self.tokens) - 1,
                                          sampling=self.sampling, return_dist=want_dist)).result
            if want_dist:
                verdict = accept_speculative(drafts, one_hot(drafts, hres.dist.shape[1]), hres.dist[-(d + 1):],
                                             self.sampling.seed, len(self.tokens))
            else:
                verdict = accept_greedy(drafts, hres.tokens[-(d + 1):])
            self.stats.verify_blocks += 1
            accepted = verdict.accepted
            self.commit(drafts[:accepted], NGRAM)
            self.commit([verdict.next_token], HEAVY)
        if self.ngram.source == DraftSource.ANSWER:
            self.stats.answer_drafts_proposed += d
            self.stats.answer_drafts_accepted += accepted
        else:
            self.stats.ngram_blocks += 1
            self.stats.ngram_drafts_proposed += d
            self.stats.ngram_drafts_accepted += accepted
        self.ngram.update(d, accepted)
        if self.hooks is not None:
            self._note = BlockNote(ACTION_NGRAM, ngram_drafted=d, ngram_accepted=accepted)

    def _gate(self, lstep) -> Decision:
        """The route gate on this block's drafts (classes, router scores, how many stand)."""
        return self.gate.decide(self.tokens[-1] if self.tokens else None, lstep.drafts, lstep.draft_probs,
                                lstep.draft_entropy, self.generated, self.params, self.route_context,
                                self.request.end_tokens, margin=lstep.draft_margin)

    def _rollback(self, seq: list[int], hres: BranchResult, first_input: int) -> bool:
        """Roll back to the first unvouched token of ``seq`` (the committed tokens + cut-off
        ending tokens) heavy rejects, strongly or by ending there; commit heavy's choice."""
        start = max(self.verified_len, self.final_len, first_input + 1)
        lo, hi = start - first_input - 1, len(seq) - first_input - 1
        reject = first_strong_rejection(
            np.asarray(seq[start:]), hres.tokens[lo:hi], hres.input_probs[lo:hi], self.params.rollback_threshold,
            self.request.end_tokens,
        )
        if reject is None:
            return False
        position = start + reject
        self.stats.rollbacks += 1
        self.stats.rolled_back_tokens += len(seq) - position
        self._reopen()
        self._truncate(min(position, len(self.tokens)))
        restored = seq[len(self.tokens) : position]  # cut-off ending tokens before the rejection stand
        self.tokens.extend(restored)
        self.sources.extend([LIGHT] * len(restored))
        self.kinds.extend([Kind.LIGHT_UNCHECKED] * len(restored))
        self.commit([hres.tokens[lo + reject]], HEAVY, Kind.ROLLED_BACK)
        return True

    def _unvouched_from(self) -> int:
        """Sequence index from which a heavy check must score: the position choosing the
        first token the heavy model has not vouched for."""
        return max(self.verified_len, self.final_len) - 1

    def needs_vouching(self) -> bool:
        """Route: the answer ended on tokens the heavy model has not checked."""
        return self.done and (len(self.tokens) > max(self.verified_len, self.final_len) or bool(self.unvouched_tail))

    async def vouch_end(self) -> None:
        """Route, ending (end_id, stop string, max_tokens): one heavy forward checks every
        unchecked token and the ending tokens; a rejection rolls back and the answer goes on."""
        tail = list(self.unvouched_tail)
        step = await self.heavy.step(self.tokens, extra=tail, score_from=self._unvouched_from(), sampling=self.sampling)
        seq = self.tokens + tail
        self._rollback(seq, step.result, step.first_scored)
        self.verified_len = len(self.tokens)
        self.unvouched_tail = ()

    # ---- driver -----------------------------------------------------------------------
    async def run_block(self) -> None:
        if self.hooks is None:
            return await self._run_block(self.params.mode)
        plan = self.hooks.plan(self.base_params, self.block)
        self.params, self.block, self.free_drafts = plan.params, plan.block, plan.free_drafts
        if plan.light_estimate is not None and not self.stats.light_plan_prefill_ms:
            e = plan.light_estimate
            self.stats.light_plan_saving_ms, self.stats.light_plan_prefill_ms = e.saving_ms, e.prefill_ms
            self.stats.light_plan_acceptance = e.acceptance
            self.stats.light_plan_explored = e.explore
        if plan.degraded:
            s = self.stats
            s.degraded_blocks += 1
            t = plan.params.confidence_threshold
            s.degraded_threshold = min(s.degraded_threshold, t) if s.degraded_threshold else t
        before = BlockStart.of(self)
        self._note = BlockNote()
        self.low_water = self.generated
        await self._run_block(plan.mode)
        self.hooks.after_block(block_record(self, plan.mode, before))

    async def _run_block(self, mode: Mode) -> None:
        if mode in (Mode.VERIFY, Mode.ROUTE) and self.params.heavy_first and self.params.stream \
                and not self.heavy.opened:
            await self.heavy_first_token()
        elif mode == Mode.HEAVY and self.free_drafts and self.heavy.opened \
                and (drafts := self._free_drafts(heavy_step=True)):
            # the light model is left out, copies are not (after the prompt's first token went out alone)
            await self.ngram_block(self.params.mode, drafts)
        elif mode == Mode.HEAVY and self.params.mode == Mode.ROUTE:
            self.stats.heavy_only_blocks += 1
            await self.route_heavy_block()
        elif mode == Mode.HEAVY:
            self.stats.heavy_only_blocks += self.params.mode == Mode.VERIFY
            await self.single_branch_block(self.heavy, HEAVY)
        elif mode == Mode.LIGHT:
            await self.single_branch_block(self.light, LIGHT)
        elif drafts := self._free_drafts():
            await self.ngram_block(mode, drafts)
        elif mode == Mode.VERIFY:
            await self.verify_block()
        else:
            await self.route_block()
        self._check_length()
        while self.params.mode == Mode.ROUTE and self.needs_vouching():
            await self.vouch_end()
            self._check_length()

    def _free_drafts(self, heavy_step: bool = False) -> list[int]:
        """n-gram / decision-cache drafts for this block, at most what the plan says pays."""
        room = self.remaining - 1
        return self.ngram.propose(self.tokens, room if self.free_drafts is None else min(room, self.free_drafts),
                                  heavy_step)

    def _check_length(self) -> None:
        if self.remaining <= 0 and not self.done:
            self.done = True
            self.stats.finish_reason = "length"

    def advance_final(self) -> list[int]:
        """Tokens that just became final (no rollback can reach them)."""
        if self.done:
            new_final = len(self.tokens)
        else:
            new_final = len(self.tokens) - self.stop_holdback
            text = self.request.stop_text
            if text is not None:  # hold back text that could still begin a stop string
                new_final = min(new_final, self.prompt_len + text.safe_len(self.tokens[self.prompt_len :]))
            if self.params.mode == Mode.ROUTE:
                new_final = min(new_final, max(self.verified_len, len(self.tokens) - self.params.rollback_window))
        new_final = max(new_final, self.final_len)
        out = self.tokens[self.final_len : new_final]
        self.final_len = new_final
        return out

    def finish_stats(self, started: float) -> RequestStats:
        s = self.stats
        s.generated_tokens = self.generated
        s.light_tokens = self.sources.count(LIGHT)
        s.heavy_tokens = self.sources.count(HEAVY)
        s.ngram_tokens = self.sources.count(NGRAM)
        s.token_kinds = "".join(self.kinds)
        if self.params.mode == Mode.ROUTE:
            s.drafts_accepted = s.light_tokens
        s.light_skipped = self.params.mode in (Mode.VERIFY, Mode.ROUTE) and not self.light.opened
        s.total_ms = (time.perf_counter() - started) * 1e3
        s.router_overhead_ms = max(0.0, s.total_ms - s.light_ms - s.heavy_ms)
        return s

    async def release(self) -> None:
        for view in (self.light, self.heavy):
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
) -> RequestStats:
    """Run one request to completion, calling ``emit`` whenever tokens become final.

    ``emit(tokens, stats, finished)`` is called with finished=True exactly once, last.
    Both branch sessions are released whatever happens (error, cancellation). ``answers``
    (the decision cache) offers an earlier answer to the same prompt as drafts and keeps
    this one.
    """
    started = time.perf_counter()
    p = request.params
    # greedy only: drafted from an earlier answer, a sampled answer would depend on the server's
    # history (same seed, other draws); greedy answers are identical either way
    use = answers is not None and p.answer_cache and p.ngram.enabled and p.temperature <= 0
    prior = answers.get(request.prompt) if use else ()
    loop = BlockLoop(request, light, heavy, session_id, hooks=hooks, request_id=request_id, prior=prior)
    try:
        while not loop.done:
            if is_cancelled():
                raise RequestCancelled("request cancelled by the client")
            await loop.run_block()
            if loop.done:
                break
            new = loop.advance_final()
            if new:
                if not loop.stats.first_token_ms:
                    loop.stats.first_token_ms = (time.perf_counter() - started) * 1e3
                await _maybe_await(emit(new, loop.stats, False))
        new = loop.advance_final()
        stats = loop.finish_stats(started)
        if not stats.first_token_ms:
            stats.first_token_ms = stats.total_ms
        await _maybe_await(emit(new, stats, True))
        if answers is not None:
            answers.put(request.prompt, loop.tokens[loop.prompt_len:])
        return stats
    finally:
        await loop.release()


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
        yield tokens[i : i + n], stood
        i += n


async def _maybe_await(value) -> None:
    if value is not None:
        await value
