"""What the block loop tells operations code about each block, and what it may be told back.

The loop stays framework-free and knows nothing of logs, metrics or load: when a request
runs with a ``BlockHooks`` object, the loop asks ``plan`` before every block (the
operations layer may shrink the block, relax a threshold or switch mode for that block)
and hands ``after_block`` a frozen ``BlockRecord`` afterwards. Hooks run on the event
loop between blocks, so they must be quick and must never block (queue, don't write).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenrouter_backend.core.protocol.names import Mode, NameEnum
from tokenrouter_backend.core.protocol.params import RouterParams
from tokenrouter_backend.core.signals.cost_model import LightEstimate


class Action(NameEnum):
    """What a block did (``BlockRecord.action``; logged as its value)."""

    LIGHT = "light"  # light generated the block itself (mode light)
    HEAVY = "heavy"  # heavy generated the block itself (mode heavy, or drafting stopped)
    VERIFY = "verify"  # light drafted, heavy checked every draft
    ACCEPT = "accept"  # route: every draft confident, committed unchecked
    FALLBACK = "fallback"  # route: confident prefix committed, heavy called at the first unsure token
    NGRAM = "ngram"  # n-gram drafts (copied from earlier text) checked by heavy; no light forward


@dataclass(frozen=True)
class DraftVerdict:
    """One light token whose heavy verdict is known at the same prefix."""

    confidence: float  # light top-1 probability of the token
    entropy: float  # light entropy at that position (nats)
    agree: bool  # heavy's own choice there is the same token
    heavy_prob: float  # probability heavy gave the light token (nan when unknown)


@dataclass(frozen=True)
class BlockRecord:
    """One block of one request (one decision-log line)."""

    request_id: str
    position: int  # generated tokens before this block
    mode: str  # Mode value this block ran in (after any plan change); plain str, as logged
    action: str  # an Action value (plain str as read back from a log)
    block_size: int  # k asked of the drafting branch
    drafted: tuple[int, ...]  # light drafts (empty for heavy/light blocks)
    confidence: tuple[float, ...]  # per drafted token
    entropy: tuple[float, ...]  # per drafted token
    committed_light: int  # drafts that stood (accepted / committed)
    heavy_agree: tuple[bool, ...]  # per drafted token with a known verdict, in order
    heavy_prob: tuple[float, ...]  # heavy prob of those drafted tokens (same length)
    rolled_back: int  # tokens removed by a rollback in this block
    heavy_calls: int
    heavy_ms: float  # awaiting heavy (hop + queue + forward)
    heavy_forward_ms: float
    light_ms: float
    latency_ms: float  # whole block, wall
    committed: int  # tokens added to the output by this block (after rollbacks)
    ngram_drafted: int = 0  # n-gram drafts the heavy model checked (action "ngram")
    ngram_accepted: int = 0  # of those, how many stood
    token_class: tuple[int, ...] = ()  # TokenClass per drafted token (token_classes.py)
    router_score: tuple[float, ...] = ()  # learned router's P(disagree) per drafted token; () = none
    acceptance: float = 0.0  # the request's running acceptance when the block began (a router feature)
    margin: tuple[float, ...] = ()  # light top-1 minus top-2 probability per drafted token; () = unknown
    output_from: int = -1  # generated index this block's output starts at (a rollback rewrites); -1 = unknown
    output: tuple[int, ...] = ()  # the answer's tokens from output_from on, after this block
    output_kinds: str = ""  # routing_trace.Kind of each of them

    def verdicts(self) -> list[DraftVerdict]:
        return [
            DraftVerdict(self.confidence[i], self.entropy[i], agree, self.heavy_prob[i])
            for i, agree in enumerate(self.heavy_agree)
        ]


@dataclass(frozen=True)
class BlockPlan:
    """What the next block runs with."""

    params: RouterParams
    block: int  # block size k for this block
    mode: Mode  # usually params.mode; Mode.HEAVY when drafting is suspended (verify)
    degraded: bool = False  # route: the threshold was lowered for overload (allow_degradation)
    free_drafts: int | None = None  # most n-gram drafts worth a heavy check (cost model); None: no cap
    light_estimate: LightEstimate | None = None  # the cost model's light decision, once made


class BlockHooks(Protocol):
    """Per-request hooks; both are optional in effect (return the input, do nothing)."""

    def plan(self, params: RouterParams, block: int) -> BlockPlan: ...

    def after_block(self, record: BlockRecord) -> None: ...
