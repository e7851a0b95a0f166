"""One branch as one request sees it: the tokens its KV session holds, chunked sends, timings.

A ``BranchView`` records exactly which tokens its branch session holds, so each call sends
only what the branch has not seen and truncates (``keep_len``) whatever is not a prefix of
the committed text any more (rejected drafts, rollbacks). It asks the branch to score only
the positions its caller reads (``score_from``), and sends an input longer than
``prefill_chunk`` tokens as several calls, so other requests' steps on that branch run
between the chunks of a long prompt instead of waiting for all of it. A session that
vanished under the request (TTL) is re-prefilled once and counted in the request's stats.
Every call that (re)starts the session (``keep_len`` 0) carries the request's cache salt:
the branch keys the session's prefix blocks by it. With ``logprobs`` >= 0 each step asks the
branch for raw log-probabilities and keeps them by position (``token_logprobs.ScoreTable``).
With ``processors`` (the request's logit processors) each scoring call carries them and the
answer tokens the session already holds before its inputs (their ``history``).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.loop.token_logprobs import ScoreTable
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult, SessionMissing
from tokenrouter_backend.core.protocol.logit_processors import LogitProcessors
from tokenrouter_backend.core.protocol.names import HEAVY

DEFAULT_PREFILL_CHUNK = 256  # tokens per call of a long input (router parameter prefill_chunk_tokens)


@dataclass(frozen=True)
class Step:
    """One step's result and where its scored positions sit in the sequence."""

    result: BranchResult
    sent: int  # input tokens sent (the uncached tail of the sequence + extra)
    first_scored: int  # sequence index of the first scored input position
    scored: int  # how many input positions were scored

    @property
    def drafts(self) -> np.ndarray:
        """The branch's choice after the last input and any further drafted tokens."""
        return self.result.tokens[self.scored - 1 :]

    @property
    def draft_probs(self) -> np.ndarray:
        return self.result.token_probs[self.scored - 1 :]

    @property
    def draft_entropy(self) -> np.ndarray:
        return self.result.entropy[self.scored - 1 :]

    @property
    def draft_margin(self) -> np.ndarray | None:
        """Top-1 minus top-2 probability per draft; None when the branch does not report it."""
        margin = self.result.margin
        return margin[self.scored - 1 :] if len(margin) == len(self.result.tokens) else None


class BranchView:
    """One branch session of one request."""

    def __init__(self, branch: Branch, session_id: int, stats: RequestStats,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, kv_window: int = 0, cache_salt: str = ""):
        self.branch = branch
        self.session_id = session_id
        self.stats = stats
        self.prefill_chunk = max(1, prefill_chunk)
        self.kv_window = kv_window  # sent with every call: the branch keeps sink + ~this many positions
        self.cache_salt = cache_salt  # sent with a call at keep_len 0: it names the session's prefix blocks
        self.cache: list[int] = []  # exactly the tokens in the branch's session
        self.opened = False
        self.opened_at = 0.0  # perf_counter() when the session's first step began (0: never)
        self.first_step_ms = 0.0  # that step's wall time: the prompt's prefill and the first scored position
        self.logprobs = -1  # -1: no log-probabilities asked; k >= 0: the tokens' and the top k (``scores``)
        self.scores = ScoreTable()
        self.processors: LogitProcessors | None = None  # the request's; each scoring call gets its history

    def synced_len(self, tokens: list[int]) -> int:
        """Cached tokens still valid: common prefix with ``tokens``, leaving >= 1 to send."""
        n = min(len(self.cache), len(tokens) - 1)
        i = 0
        while i < n and self.cache[i] == tokens[i]:
            i += 1
        return i

    def resend_from(self, length: int) -> None:
        """The next step sends the tokens from ``length`` on again (and can score their positions)."""
        del self.cache[length:]

    async def step(self, tokens: list[int], extra=(), score_from: int | None = None, **op_fields) -> Step:
        """Send tokens[keep:] + extra; score sequence positions from ``score_from`` on (None:
        only the last one, which chooses the next token)."""
        seq = list(tokens) + [int(t) for t in extra]
        keep = self.synced_len(tokens)
        first = not self.opened
        if first:
            self.opened_at = time.perf_counter()
        if self.logprobs >= 0:
            self.scores.before_step(seq)
            op_fields.setdefault("logprobs", self.logprobs)
        try:
            out = await self._send(seq, keep, score_from, op_fields)
        except SessionMissing:
            # expired (TTL) under us: re-prefill from scratch once
            self.stats.reprefills += 1
            self.stats.reprefill_tokens += keep
            self.cache = []
            out = await self._send(seq, 0, score_from, op_fields)
        if first:
            self.first_step_ms = (time.perf_counter() - self.opened_at) * 1e3
        self.cache = seq + [int(t) for t in out.drafts[:-1]]
        if self.logprobs >= 0:
            self.scores.record(out.result, seq, out.first_scored, out.scored)
        return out

    async def _send(self, seq: list[int], keep: int, score_from: int | None, op_fields: dict) -> Step:
        """The calls of one step: leading chunks of a long input (nothing scored), then the rest."""
        n = len(seq) - keep
        first = len(seq) - 1 if score_from is None else min(max(score_from, keep), len(seq) - 1)
        scored = len(seq) - first
        pos = keep
        window, chunk = self.kv_window, self.prefill_chunk
        if window and len(seq) - pos > window + max(chunk, scored):
            # the branch keeps only its sink and the last ``window`` positions: one call with
            # a window of 1 feeds the sink and leaves the rest before the window out
            end = len(seq) - window
            await self._timed(self._op(pos, seq[pos:end], score_last=1, kv_window=1))
            self.cache = seq[:end]
            pos = end
        while len(seq) - pos > max(chunk, scored):
            size = min(chunk, len(seq) - pos - scored)
            await self._timed(self._op(pos, seq[pos:pos + size], score_last=1))
            self.cache = seq[:pos + size]
            pos += size
        if self.processors is not None:
            start = self.processors.answer_start
            op_fields["processors"] = dataclasses.replace(self.processors, history=tuple(seq[start:pos]))
        result = await self._timed(self._op(pos, seq[pos:], score_last=scored, **op_fields))
        return Step(result, n, first, scored)

    def _op(self, keep: int, ids: list[int], **fields) -> BranchOp:
        """One call on the view's branch session: its window, and its salt when the call starts the session."""
        fields.setdefault("kv_window", self.kv_window)
        return BranchOp(self.session_id, keep, tuple(ids), cache_salt=self.cache_salt if keep == 0 else "", **fields)

    async def _timed(self, op: BranchOp) -> BranchResult:
        self.opened = True
        t0 = time.perf_counter()
        try:
            result = await self.branch.step(op)
        finally:
            ms = (time.perf_counter() - t0) * 1e3
            if self.branch.name == HEAVY:
                self.stats.heavy_calls += 1
                self.stats.heavy_ms += ms
            else:
                self.stats.light_calls += 1
                self.stats.light_ms += ms
        if self.branch.name == HEAVY:
            self.stats.heavy_forward_ms += result.forward_ms
            self.stats.heavy_reused_tokens += result.reused_tokens
        else:
            self.stats.light_forward_ms += result.forward_ms
            self.stats.light_reused_tokens += result.reused_tokens
        return result
