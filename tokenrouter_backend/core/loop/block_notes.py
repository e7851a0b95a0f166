"""What the block loop notes about the block in progress, for its ``BlockRecord`` (hooks)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from tokenrouter_backend.core.loop.hooks import Action, BlockRecord
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.loop.transcript import Transcript
from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.signals.route_gate import Decision


@dataclass
class BlockNote:
    """What the mode functions learnt about the current block (only kept with hooks)."""

    action: Action | None = None  # None: the mode's own (a heavy / light block)
    drafted: Sequence[int] = ()  # light drafts
    confidence: Sequence[float] = ()  # per drafted token
    entropy: Sequence[float] = ()  # per drafted token
    committed_light: int = 0  # drafts that stood
    heavy_agree: Sequence[bool] = ()  # per drafted token with a known heavy verdict
    heavy_prob: Sequence[float] = ()  # heavy prob of those tokens
    ngram_drafted: int = 0  # n-gram drafts the heavy model checked in this block
    ngram_accepted: int = 0  # of those, how many stood
    gate: Decision | None = None  # route_gate.Decision: the route gate's view of the drafts (classes, router scores)
    acceptance: float = 0.0  # the request's running acceptance when the block began


@dataclass(frozen=True)
class BlockStart:
    """Counters when a block began: its BlockRecord reports the differences."""

    generated: int
    heavy_calls: int
    heavy_ms: float
    heavy_forward_ms: float
    light_ms: float
    rolled_back_tokens: int
    started: float  # time.perf_counter()
    block: int  # block size planned for it

    @classmethod
    def of(cls, generated: int, s: RequestStats, block: int) -> "BlockStart":
        return cls(generated, s.heavy_calls, s.heavy_ms, s.heavy_forward_ms, s.light_ms,
                   s.rolled_back_tokens, time.perf_counter(), block)


def block_record(request_id: str, note: BlockNote, stats: RequestStats, transcript: Transcript, mode: Mode,
                 before: BlockStart) -> BlockRecord:
    """The ``BlockRecord`` of the block just run (hooks)."""
    n, s = note, stats
    default_action = Action.HEAVY if mode in (Mode.HEAVY, Mode.VERIFY) else Action.LIGHT
    output, kinds = transcript.output_since_low_water()
    agree = tuple(bool(a) for a in n.heavy_agree)
    return BlockRecord(
        request_id=request_id, position=before.generated, mode=str(mode), action=n.action or default_action,
        block_size=before.block, drafted=tuple(int(t) for t in n.drafted),
        confidence=tuple(round(float(x), 5) for x in n.confidence),
        entropy=tuple(round(float(x), 5) for x in n.entropy),
        committed_light=int(n.committed_light), heavy_agree=agree,
        heavy_prob=tuple(round(float(x), 5) for x in n.heavy_prob)[: len(agree)],
        rolled_back=s.rolled_back_tokens - before.rolled_back_tokens,
        heavy_calls=s.heavy_calls - before.heavy_calls, heavy_ms=s.heavy_ms - before.heavy_ms,
        heavy_forward_ms=s.heavy_forward_ms - before.heavy_forward_ms, light_ms=s.light_ms - before.light_ms,
        latency_ms=(time.perf_counter() - before.started) * 1e3, committed=transcript.generated - before.generated,
        ngram_drafted=n.ngram_drafted, ngram_accepted=n.ngram_accepted,
        **(n.gate.record_fields() if n.gate is not None else {}), acceptance=round(float(n.acceptance), 5),
        output_from=transcript.low_water, output=output, output_kinds=kinds)


def note_route_verdicts(note: BlockNote, hres, first_input: int, end: int) -> None:
    """Heavy's verdict on every token drafted in this block (all were sent to heavy);
    ``end``: the sequence length after the block's commits."""
    drafted, kept = note.drafted, note.committed_light
    agree, probs = [], []
    for i in range(len(drafted)):
        q = end - kept + i  # sequence position of drafted[i]
        j = q - first_input - 1  # heavy result index of its choice at q
        if j < 0:
            agree, probs = [], []  # heavy did not score this one: keep only a full suffix
            continue
        agree.append(int(hres.tokens[j]) == int(drafted[i]))
        probs.append(float(hres.input_probs[j]))
    note.heavy_agree, note.heavy_prob = agree, probs
