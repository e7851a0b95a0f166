"""One request's answer so far: its tokens, where each came from, and every cursor over them.

The ``Transcript`` is the only place tokens are appended (``commit``, stop rules applied),
taken back (``rollback``) or declared final (``advance_final``); strategies and the loop ask
it, they never edit the lists. Cursors, as sequence indices (prompt included):

    0 ........ prompt_len ........ final_len ........ verified_len ........ len(tokens)
               answer starts       streamed: no       route: the heavy      end of what is
                                   rollback reaches   model vouched up to   committed

``final_len`` and ``verified_len`` are not ordered between themselves (a streamed route answer
may hold back vouched tokens for a stop string); ``unvouched_from`` takes the later one.
``unvouched_tail``: route's ending tokens cut off by a stop rule before the heavy model saw
them (the end check scores them). ``low_water``: with hooks, the lowest generated index the
current block rewrote from (its ``BlockRecord`` reports the output from there).
"""
from __future__ import annotations

from typing import Sequence

from tokenrouter_backend.core.loop.routing_trace import Kind, default_kind
from tokenrouter_backend.core.protocol.names import Mode, Source
from tokenrouter_backend.core.text.stop_text import StopText, first_stop
from tokenrouter_backend.core.text.stopping import StopCriteria


class Transcript:
    """Tokens with their source and kind; the cursors; the answer's end."""

    def __init__(self, prompt: Sequence[int], stop: StopCriteria, stop_text: StopText | None, mode: Mode):
        self.tokens: list[int] = list(prompt)
        self.sources: list[Source] = []  # per generated token
        self.kinds: list[Kind] = []  # per generated token (--show-routing)
        self.prompt_len = len(self.tokens)
        self.final_len = self.prompt_len
        self.verified_len = self.prompt_len
        self.low_water = 0
        self.unvouched_tail: tuple[int, ...] = ()
        self.stop, self.stop_text = stop, stop_text
        # a stop sequence may start in tokens already generated: hold back len - 1 of them
        self.stop_holdback = max((len(s) - 1 for s in stop.stop_sequences), default=0)
        self.mode = mode  # the request's mode for the block in progress (default kinds, what is final)
        self.done = False
        self.finish_reason = ""  # "end_id" | "stop_words" | "length" once done
        self.stop_trim = 0  # characters of the kept tokens' text a stop string began in

    # ---- reading ----------------------------------------------------------------------
    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def answer(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def unvouched_from(self) -> int:
        """Sequence index from which a heavy check must score: the position choosing the
        first token the heavy model has not vouched for."""
        return max(self.verified_len, self.final_len) - 1

    @property
    def needs_vouching(self) -> bool:
        """Route: the answer ended on tokens the heavy model has not checked."""
        return self.done and (len(self.tokens) > max(self.verified_len, self.final_len) or bool(self.unvouched_tail))

    def count(self, source: Source) -> int:
        return self.sources.count(source)

    def token_kinds(self) -> str:
        return "".join(self.kinds)

    def output_since_low_water(self) -> tuple[tuple[int, ...], str]:
        """The answer's tokens and kinds from ``low_water`` on (a block's record)."""
        return tuple(self.tokens[self.prompt_len + self.low_water:]), "".join(self.kinds[self.low_water:])

    # ---- writing ----------------------------------------------------------------------
    def commit(self, new, source: Source, kind: Kind | None = None) -> int:
        """Append tokens from ``source``; apply stop rules; returns how many stayed."""
        if self.done:
            return 0
        start = self.generated
        self.tokens.extend(int(t) for t in new)
        self.sources.extend([source] * len(new))
        self.kinds.extend([kind or default_kind(source, self.mode)] * len(new))
        generated = self.answer
        stop = first_stop(generated, start, self.stop, self.stop_text, min_keep=self.final_len - self.prompt_len)
        if stop is not None:
            self.unvouched_tail = tuple(generated[stop.keep: stop.tail_end])
            self._truncate(self.prompt_len + stop.keep)
            self.done = True
            self.finish_reason, self.stop_trim = stop.reason, stop.trim
        return self.generated - start

    def rollback(self, seq: Sequence[int], position: int, heavy_token: int) -> None:
        """The heavy model rejected ``seq[position]`` (``seq``: the committed tokens and any
        cut-off ending tokens): keep what precedes it, the cut-off ones restored as unchecked
        light tokens, and commit the heavy model's token there. The answer goes on."""
        self.done, self.unvouched_tail, self.finish_reason, self.stop_trim = False, (), "", 0
        self._truncate(min(position, len(self.tokens)))
        restored = seq[len(self.tokens): position]
        self.tokens.extend(restored)
        self.sources.extend([Source.LIGHT] * len(restored))
        self.kinds.extend([Kind.LIGHT_UNCHECKED] * len(restored))
        self.commit([heavy_token], Source.HEAVY, Kind.ROLLED_BACK)

    def mark_verified(self) -> None:
        """The heavy model has seen every committed token."""
        self.verified_len = len(self.tokens)

    def clear_unvouched_tail(self) -> None:
        """The heavy model saw the cut-off ending tokens too."""
        self.unvouched_tail = ()

    def end_at_length(self, max_tokens: int) -> None:
        if self.generated >= max_tokens and not self.done:
            self.done = True
            self.finish_reason = "length"

    def start_block(self) -> None:
        self.low_water = self.generated

    def advance_final(self, rollback_window: int) -> list[int]:
        """Tokens that just became final (no rollback can reach them, no stop string can cut them)."""
        if self.done:
            new_final = len(self.tokens)
        else:
            new_final = len(self.tokens) - self.stop_holdback
            if self.stop_text is not None:  # hold back text that could still begin a stop string
                new_final = min(new_final, self.prompt_len + self.stop_text.safe_len(self.answer))
            if self.mode == Mode.ROUTE:
                new_final = min(new_final, max(self.verified_len, len(self.tokens) - rollback_window))
        new_final = max(new_final, self.final_len)
        out = self.tokens[self.final_len: new_final]
        self.final_len = new_final
        return out

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]
        del self.sources[length - self.prompt_len:]
        del self.kinds[length - self.prompt_len:]
        self.low_water = min(self.low_water, length - self.prompt_len)
