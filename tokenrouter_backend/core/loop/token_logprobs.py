"""Log-probabilities of an answer's tokens, and which model each number came from.

Each ``BranchView`` asked for log-probabilities keeps a ``ScoreTable``: for every sequence
position its branch scored, the token the branch chose there and the input token it read
there next, each with its raw log-probability (log-softmax of the logits: no temperature,
top-k or top-p, as vLLM's default), and the top k. A score holds only while the tokens
before its position are the ones the branch read: a step that sends a different prefix
drops the scores past the first difference. When tokens become final, ``answer_logprobs``
looks each one up at its position — the heavy model's score first, then the light model's
— so verify answers carry the heavy model's numbers for every token (the same as heavy-only
at the same positions) and route answers the light model's where a draft stood unchecked.
Framework-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from tokenrouter_backend.core.protocol.branch_protocol import BranchResult

NOT_READ = -1  # a position whose next input the branch did not read (its own draft's position)


@dataclass(frozen=True)
class PositionScore:
    """One branch's word on one sequence position."""

    chosen: int  # the token the branch chose there
    chosen_logprob: float
    read: int  # the input token the branch read there (NOT_READ: none)
    read_logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the k most likely tokens, most likely first

    def logprob_of(self, token: int) -> float | None:
        if token == self.chosen:
            return self.chosen_logprob
        if token == self.read:
            return self.read_logprob
        return next((lp for t, lp in self.top if t == token), None)


@dataclass(frozen=True)
class TokenLogprob:
    """One answer token's log-probability, the model whose number it is, and that model's top k.

    ``branch`` is "" and ``logprob`` NaN for a token no model scored (a model-free draft that
    stood unchecked)."""

    token: int
    logprob: float
    branch: str
    top: tuple[tuple[int, float], ...] = ()


# on_logprobs(the new final tokens' log-probabilities), called by ``generate`` just before their emit
OnLogprobs = Callable[[list[TokenLogprob]], None]


@dataclass
class ScoreTable:
    """One branch session's scores by sequence position, valid for the prefix ``read``."""

    scores: dict[int, PositionScore] = field(default_factory=dict)
    read: list[int] = field(default_factory=list)  # the tokens the scores were made upon

    def before_step(self, seq: Sequence[int]) -> None:
        """A step will read ``seq``: scores past its first difference with ``read`` are stale."""
        same = common_prefix(self.read, seq)
        if same < len(self.read):
            self.scores = {p: s for p, s in self.scores.items() if p <= same}
            del self.read[same:]

    def record(self, result: BranchResult, seq: Sequence[int], first_scored: int, scored: int) -> None:
        """A step's scored rows: row r chose the token at position ``first_scored + 1 + r``;
        rows before the last scored input also read the next input there."""
        if len(result.token_logprobs) != len(result.tokens):
            return  # the branch returned no log-probabilities (an older repository's branch)
        top_ids, top_lps = result.top_ids, result.top_logprobs
        has_top = top_ids.ndim == 2 and len(top_ids) == len(result.tokens) and top_ids.shape[1] > 0
        for r, (token, lp) in enumerate(zip(result.tokens.tolist(), result.token_logprobs.tolist())):
            position = first_scored + 1 + r
            inner = r < scored - 1 and r < len(result.input_logprobs)
            self.scores[position] = PositionScore(
                int(token), float(lp),
                int(seq[position]) if inner else NOT_READ,
                float(result.input_logprobs[r]) if inner else math.nan,
                tuple(zip(top_ids[r].tolist(), top_lps[r].tolist())) if has_top else ())
        drafted = [int(t) for t in result.tokens[scored - 1:-1]]
        self.read = list(seq) + drafted

    def valid_through(self, tokens: Sequence[int]) -> int:
        """The last position whose score still holds for ``tokens``."""
        return common_prefix(self.read, tokens)

    def get(self, position: int) -> PositionScore | None:
        return self.scores.get(position)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n and list(a[:n]) == list(b[:n]):
        return n
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.nonzero(x != y)[0]
    return int(diff[0]) if len(diff) else n


def answer_logprobs(tokens: Sequence[int], start: int, end: int, tables: Sequence[tuple[str, ScoreTable]]
                    ) -> list[TokenLogprob]:
    """``tokens[start:end]`` with their log-probabilities from the first of ``tables`` (branch
    name, table) that scored each one at its position upon the same prefix."""
    valid = [(name, table, table.valid_through(tokens)) for name, table in tables]
    out = []
    for position in range(start, end):
        token = int(tokens[position])
        found = TokenLogprob(token, math.nan, "")
        for name, table, through in valid:
            score = table.get(position) if position <= through else None
            lp = score.logprob_of(token) if score is not None else None
            if lp is not None:
                found = TokenLogprob(token, lp, name, score.top)
                break
        out.append(found)
    return out


async def score_prompt(state) -> list[TokenLogprob]:
    """``GenerationRequest.prompt_logprobs``: the heavy model scores every prompt position (its
    session's first step; the loop's next heavy step reads the prefill's KV). The
    log-probability of each prompt token after the first, from what the heavy model read there."""
    prompt = list(state.request.prompt)
    await state.heavy.step(prompt, score_from=0, sampling=state.sampling)
    return answer_logprobs(prompt, 1, len(prompt), ((state.heavy.branch.name, state.heavy.scores),))


def final_logprobs(state, start: int) -> list[TokenLogprob]:
    """The log-probabilities of the answer's tokens from ``start`` to the final cursor
    (``RequestState``: heavy's numbers first, then light's)."""
    tables = ((state.heavy.branch.name, state.heavy.scores), (state.light.branch.name, state.light.scores))
    return answer_logprobs(state.transcript.tokens, start, state.transcript.final_len, tables)
