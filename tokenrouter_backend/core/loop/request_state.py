"""What one request's block strategies share: the transcript, both branch sessions, the knobs
of the block in progress, the request's counters and what the hooks are told.

``RequestState`` is request-scoped (never on a model instance); the strategies in
``modes/`` read it and change the answer only through its ``transcript``.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Sequence

from tokenrouter_backend.core.loop.block_notes import BlockNote
from tokenrouter_backend.core.loop.branch_view import BranchView
from tokenrouter_backend.core.loop.drafts import Drafts, DraftSource
from tokenrouter_backend.core.loop.ngram import NgramDrafter
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.loop.transcript import Transcript
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import Sampling
from tokenrouter_backend.core.protocol.logit_processors import LogitProcessors
from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import RouterParams
from tokenrouter_backend.core.signals.prompt_surprise import PromptSurprise
from tokenrouter_backend.core.signals.route_gate import Decision, RouteContext, RouteGate
from tokenrouter_backend.core.text.stop_text import StopText
from tokenrouter_backend.core.text.stopping import StopCriteria


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
    cache_salt: str = ""  # the tenant whose answer cache and KV prefix blocks it may share ("" = salt-less)
    queued_ms: float = 0.0  # waited for admission before the loop began (reported in stats)
    logprobs: int = -1  # the answer's log-probabilities: -1 none, 0 the tokens', k > 0 also the top k
    prompt_logprobs: bool = False  # also the prompt's (the heavy model scores every prompt position once)
    score_only: bool = False  # no answer at all: the prompt's log-probabilities only (max_tokens 0)
    processors: LogitProcessors | None = None  # penalties, bias, min_tokens: on both branches' every scored row

    @property
    def stop(self) -> StopCriteria:
        return StopCriteria(self.params.max_tokens, self.end_id, self.stop_sequences)

    @property
    def end_tokens(self) -> frozenset[int]:
        """Single tokens that end an answer (end_id, document ends)."""
        ends = {s[0] for s in self.stop_sequences if len(s) == 1}
        return frozenset(ends | ({self.end_id} if self.end_id is not None else set()))


def request_processors(request: GenerationRequest) -> LogitProcessors:
    """The request's processors with what the request knows: where its answer starts, the
    prompt's distinct tokens (repetition penalty), the tokens that end it (min_tokens)."""
    p = request.processors
    seen = tuple(sorted(set(request.prompt))) if p.repetition != 1.0 else ()
    return dataclasses.replace(p, answer_start=len(request.prompt), prompt_seen=seen,
                               ends=tuple(sorted(request.end_tokens)) if p.min_tokens else ())


class RequestState:
    """One request in flight."""

    def __init__(self, request: GenerationRequest, light: Branch, heavy: Branch, session_id: int | None = None,
                 prior: Sequence[int] = (), noting: bool = False):
        self.request = request
        self.params = request.params  # the block in progress's (hooks may adjust them per block)
        self.stats = RequestStats(mode=str(self.params.mode), prompt_tokens=len(request.prompt))
        surprise = request.prompt_surprise
        if surprise is not None and surprise.scored:
            self.stats.prompt_nll, self.stats.prompt_nll_tokens = surprise.mean, surprise.scored
            self.stats.prompt_score_ms = surprise.elapsed_ms
        sid = session_id if session_id is not None else random.getrandbits(63)
        chunk = self.params.prefill_chunk_tokens
        salt = request.cache_salt
        self.light = BranchView(light, sid, self.stats, chunk, kv_window=self.params.light_kv_window, cache_salt=salt)
        self.heavy = BranchView(heavy, sid, self.stats, chunk, cache_salt=salt)
        # the light model's numbers reach an answer only where its tokens stand unchecked
        self.heavy.logprobs = request.logprobs
        self.light.logprobs = request.logprobs if self.params.mode in (Mode.ROUTE, Mode.LIGHT) else -1
        if request.processors is not None and request.processors.active:
            self.light.processors = self.heavy.processors = request_processors(request)
        self.transcript = Transcript(request.prompt, request.stop, request.stop_text, self.params.mode)
        self.block = self.params.block_size  # drafts asked of the next block
        self.free_drafts: int | None = None  # the plan's cap on model-free drafts (None: the drafter's own)
        self.sampling = Sampling(self.params.temperature, self.params.top_k, self.params.top_p,
                                 self.params.random_seed, self.params.min_p)
        self.ngram = NgramDrafter(self.params.ngram, prior, self.transcript.prompt_len)
        self.stats.answer_cache_hit = bool(prior) and self.params.ngram.enabled
        self.gate = request.route_gate or RouteGate()
        self.route_context = RouteContext()  # running acceptance (a learned-router feature)
        self.noting = noting  # hooks are on: strategies fill ``note`` for the block's record
        self.note = BlockNote()

    @property
    def tokens(self) -> list[int]:
        return self.transcript.tokens

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - self.transcript.generated

    @property
    def sampled(self) -> bool:
        """Speculative sampling (the branches return distributions) rather than greedy."""
        return not self.sampling.greedy

    def decide(self, drafts: Drafts) -> Decision:
        """The route gate on a block's light drafts (classes, router scores, how many stand)."""
        return self.gate.decide(self.tokens[-1] if self.tokens else None, drafts.tokens, drafts.confidence,
                                drafts.entropy, self.transcript.generated, self.params, self.route_context,
                                self.request.end_tokens, margin=drafts.margin)

    def observe_draft(self, source: DraftSource, proposed: int, accepted: int) -> None:
        """Count drafts by their proposer (the ``routing_stats`` keys of each)."""
        s = self.stats
        if source == DraftSource.LIGHT:
            s.drafts_proposed += proposed
            s.drafts_accepted += accepted
        elif source == DraftSource.COPY:
            s.light_copy_blocks += 1
            s.light_copy_drafts_proposed += proposed
            s.light_copy_drafts_accepted += accepted
        elif source == DraftSource.ANSWER:
            s.answer_drafts_proposed += proposed
            s.answer_drafts_accepted += accepted
        else:
            s.ngram_blocks += 1
            s.ngram_drafts_proposed += proposed
            s.ngram_drafts_accepted += accepted
