"""How a branch engine run is cut into forwards: op checks, session waves, forward groups.

``check_op`` refuses an op the model cannot serve (empty or out-of-vocabulary input, draft
length, ``score_last``, ``kv_window``, more positions than the model has). ``session_waves``
splits one call's ops into waves of distinct sessions, each session's ops in order.
``next_forward`` picks the ops (and chunk lengths) of the next forward: shortest remaining
input first, as many as fit ``max_forward_tokens`` padded tokens; with lone steps a
one-token chunk is a forward of its own. ``OpWork`` is one op in flight: its session, what
was fed, and the scores gathered so far. Framework-free; ``branch_engine`` runs the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter_backend.core.protocol.branch_protocol import BranchError, BranchOp
from tokenrouter_backend.engine.kv_session import Session


@dataclass
class OpWork:
    """One op in flight (engine-internal, mutable)."""

    index: int
    op: BranchOp
    session: Session
    first_scored: int = 0  # input index of the first position that gets logits
    fed: int = 0  # input tokens already fed (or taken from the prefix cache)
    reused: int = 0  # input tokens whose KV came from the prefix cache
    skip_at: int = -1  # kv_window: input index where ``skip_len`` inputs are left out
    skip_len: int = 0
    tokens: list = field(default_factory=list)  # per scored chunk / draft step: int32 [rows]
    probs: list = field(default_factory=list)
    entropy: list = field(default_factory=list)
    margins: list = field(default_factory=list)  # top-1 minus top-2 probability per row
    dists: list = field(default_factory=list)
    input_probs: list = field(default_factory=list)  # per scored chunk: float32 [rows]
    logprobs: list = field(default_factory=list)  # op.logprobs >= 0: raw log-prob of each row's token
    input_logprobs: list = field(default_factory=list)  # and of each scored input's next input
    top_ids: list = field(default_factory=list)  # op.logprobs > 0: [rows, k] per chunk / draft step
    top_logprobs: list = field(default_factory=list)
    last_norm: object = None  # the last scored rows' log-normalizers (raw log-softmax offsets)

    def answer_before(self, position: int) -> list[int]:
        """``op.processors``: the answer's tokens at sequence positions ``answer_start`` …
        ``position`` - 1 — the step's history, then its inputs, then the tokens it drafted."""
        op, p = self.op, self.op.processors
        keep, n = op.keep_len, len(op.input_ids)
        tokens = list(p.history) + list(op.input_ids[max(0, p.answer_start - keep): max(0, min(n, position - keep))])
        if position > keep + n and self.tokens:  # drafts: the choices from the last scored input's row on
            chosen = [int(t) for chunk in self.tokens for t in chunk]
            first = op.scored - 1
            tokens += chosen[first: first + position - keep - n]
        return tokens
    drafted: int = 0
    forward_ms: float = 0.0
    forward_tokens: int = 0  # padded tokens of the forwards this op took part in
    forwards: int = 0
    batch_size: int = 0

    @property
    def remaining(self) -> int:
        return len(self.op.input_ids) - self.fed

    @property
    def feedable(self) -> int:
        """Inputs the next forward may take (up to a kv_window skip)."""
        if self.skip_len and self.fed < self.skip_at:
            return self.skip_at - self.fed
        return self.remaining

    def last(self, arrays: list) -> float:
        return float(arrays[-1][-1])

    def wants_more(self, max_len: int) -> bool:
        """Drafting goes on: budget left, last draft confident, room to feed it."""
        op = self.op
        return (0 < self.drafted < op.draft_len
                and self.last(self.probs) >= op.min_confidence
                and self.last(self.entropy) <= op.max_entropy
                and self.session.length < max_len)


def check_op(op: BranchOp, name: str, vocab: int, max_draft_len: int, max_len: int) -> None:
    """Raise ``BranchError`` (prefixed with the branch ``name``) for an op the model cannot serve."""
    n = len(op.input_ids)
    if n < 1:
        raise BranchError(f"{name}: input_ids needs at least one token")
    if min(op.input_ids) < 0 or max(op.input_ids) >= vocab:
        bad = next(t for t in op.input_ids if not 0 <= t < vocab)
        raise BranchError(f"{name}: input_ids holds token {bad}, outside the vocabulary 0..{vocab - 1}")
    if not 0 <= op.draft_len <= max_draft_len:
        raise BranchError(f"{name}: draft_len {op.draft_len} outside 0..{max_draft_len}")
    if not 0 <= op.score_last <= n:
        raise BranchError(f"{name}: score_last {op.score_last} outside 0..{n} (0 = every input position)")
    if op.kv_window < 0:
        raise BranchError(f"{name}: kv_window {op.kv_window} must be >= 0 (0 = all positions)")
    p = op.processors
    if p is not None:
        ids = [t for t, _ in p.bias] + list(p.ends) + list(p.prompt_seen) + list(p.history)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise BranchError(f"{name}: logit_processors holds token {bad}, outside the vocabulary 0..{vocab - 1}")
    if op.keep_len + n > max_len:
        raise BranchError(
            f"{name}: session {op.session_id} would hold keep_len {op.keep_len} + {n} new "
            f"tokens = {op.keep_len + n}, more than the model's {max_len} positions")


def session_waves(ops: list[BranchOp]) -> list[list[int]]:
    """Split op indices into waves of distinct sessions, keeping each session's order."""
    waves: list[list[int]] = []
    seen: dict[int, int] = {}
    for i, op in enumerate(ops):
        k = seen.get(op.session_id, 0)
        seen[op.session_id] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    return waves


def next_forward(pending: list[OpWork], budget: int, lone: bool) -> list[tuple[OpWork, int]]:
    """The ops (and chunk lengths) of the next forward: shortest remaining first, as many
    as fit the token ``budget`` with rows padded to the longest chunk. With ``lone`` steps a
    one-token chunk is a forward of its own and never joins one of longer chunks."""
    group: list[tuple[OpWork, int]] = []
    width = 0
    for w in sorted(pending, key=lambda x: x.remaining):
        chunk = min(w.feedable, budget)
        if lone and chunk == 1:
            if not group:
                return [(w, 1)]
            continue
        if group and (len(group) + 1) * max(width, chunk) > budget:
            break
        group.append((w, chunk))
        width = max(width, chunk)
    return group
