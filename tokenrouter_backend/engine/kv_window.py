"""A bounded KV window for one session (StreamingLLM-style): sink positions + the recent ones.

A step that asks for ``kv_window`` W keeps, of its session, the first ``sink`` positions
and the last W or so; positions in between lose their KV, and input tokens that would land
there are not computed at all — a long prompt costs the session about sink + W positions of
prefill and memory. Positions stay those of the full sequence (position ids are the
sequence index, the attention mask covers the kept entries), so the model sees a prompt
with its middle cut out. Meant for the light branch: the heavy model checks what it
drafts, so a light model that forgot the middle of a long context costs acceptance, never
correctness.

Kept entries are positions ``[0, sink)`` and ``[sink + gap, length)``. Until a position is
dropped a windowed session is an ordinary one (prefix cache included); the step that drops
positions first copies any shared blocks into the session's own buffer, and from then on
it shares nothing (its KV no longer is a function of the tokens alone). The window moves
only when it has overgrown by a quarter (amortized: one copy of W entries per W/4 tokens).
A step may not truncate into the gap (``SessionMissing``: the router re-prefills).
Framework-free; works on any ``KVStore`` session buffer kind (``kv_session.Session``).
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenrouter_backend.engine.kv_session import Session

DEFAULT_SINK_TOKENS = 4  # kv_sink_tokens default (StreamingLLM keeps 4 attention sinks)


@dataclass(frozen=True)
class WindowPlan:
    """What one step does to its session's window (input indices of the step's input_ids)."""

    evict_to: int  # first position kept after the sink once the step starts (0: no eviction)
    skip_at: int  # input index at which ``skip`` input tokens are left out (-1: none)
    skip: int = 0


NO_PLAN = WindowPlan(0, -1)


def plan(s: Session, keep_len: int, n: int, first_scored: int, window: int, sink: int) -> WindowPlan:
    """The eviction and skipped input of a step feeding ``n`` tokens after ``keep_len``;
    scored inputs (from ``first_scored``) are always fed."""
    if window <= 0:
        return NO_PLAN
    sink = s.sink if s.windowed else sink
    start = sink + s.gap  # first recent position now
    cut = min(keep_len + n - window, keep_len + first_scored)
    if cut <= sink or cut - max(start, sink) < max(1, window // 4):
        return NO_PLAN
    if keep_len <= sink:  # a new (or still short) session: feed the sink, then jump to cut
        return WindowPlan(0, sink - keep_len, cut - sink)
    if cut <= keep_len:  # only cached positions go
        return WindowPlan(cut, -1)
    return WindowPlan(keep_len, 0, cut - keep_len)  # all recent entries go, then skip input


def start(s: Session, sink: int) -> None:
    """Mark a new session windowed (fixed for its life)."""
    s.windowed, s.sink, s.gap = True, sink, 0


def evict(s: Session, upto: int) -> None:
    """Drop the KV of positions ``[sink + gap, upto)``; later entries move down."""
    first = s.sink + s.gap
    if upto <= first:
        return
    kept = s.length - upto  # recent entries that stay
    src = s.buf[:, :, :, s.entries - kept: s.entries]
    src = src.copy() if hasattr(src, "copy") else src.clone()  # numpy / torch; ranges may overlap
    s.buf[:, :, :, s.sink: s.sink + kept] = src
    s.gap += upto - first


def skip(s: Session, count: int) -> None:
    """Leave the next ``count`` positions out (the session's recent part must be empty)."""
    if s.entries != s.sink:
        raise AssertionError(f"kv window: skipping with {s.entries - s.sink} recent entries held")
    s.length += count
    s.gap += count
