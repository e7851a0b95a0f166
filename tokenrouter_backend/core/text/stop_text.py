"""Stop strings matched on the detokenized text, wherever token boundaries fall.

A stop string may start or end inside a token and span several tokens, so it is looked
for in ``decode(generated)``, never as token ids. A hit is mapped back to tokens: the
tokens to keep (the fewest whose text reaches the start of the stop string), how many
characters at the end of their text to drop, and the tokens that form the stop string
(what a route-mode heavy check must see). While streaming, only tokens whose text lies
before the longest suffix that could still begin a stop string are safe to emit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tokenrouter_backend.core.protocol.input_limits import OversizedElement
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.core.text.detokenize import CONTEXT_TOKENS
from tokenrouter_backend.core.text.stopping import Stop, StopCriteria, find_stop

REPLACEMENT = "\ufffd"  # what a decoder yields for an incomplete multi-byte character
MAX_STOP_WORDS = 16
MAX_STOP_WORD_CHARS = 256
UTF8_MAX_BYTES = 4  # bytes per character at most: longer raw input is refused undecoded

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class TextHit:
    """Where a stop string cuts the generated tokens."""

    keep: int  # generated tokens that remain
    trim: int  # characters at the end of decode(generated[:keep]) that belong to the stop string
    end: int  # generated[:end] holds the whole stop string


def parse_stop_words(values) -> tuple[str, ...]:
    """The ``stop_words`` input (strings or UTF-8 bytes) -> validated strings.

    The count is checked before any element, an element's byte length before it is decoded.
    """
    if len(values) > MAX_STOP_WORDS:
        raise InvalidRequest(f"stop_words has {len(values)} entries; at most {MAX_STOP_WORDS} allowed")
    words = []
    for i, v in enumerate(values):
        if isinstance(v, OversizedElement):  # over MAX_BYTES_ELEMENT bytes: never copied
            raise InvalidRequest(f"stop_words[{i}] is {v.nbytes} bytes; at most {MAX_STOP_WORD_CHARS} "
                                 "characters allowed")
        if isinstance(v, bytes) and len(v) > MAX_STOP_WORD_CHARS * UTF8_MAX_BYTES:
            raise InvalidRequest(f"stop_words[{i}] is {len(v)} bytes; at most {MAX_STOP_WORD_CHARS} "
                                 "characters allowed")
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidRequest(f"stop_words[{i}] is not valid UTF-8") from exc
        if not isinstance(v, str) or not v:
            raise InvalidRequest(f"stop_words[{i}] must be a non-empty string; got {v!r}")
        if len(v) > MAX_STOP_WORD_CHARS:
            raise InvalidRequest(f"stop_words[{i}] has {len(v)} characters; at most {MAX_STOP_WORD_CHARS} allowed")
        words.append(v)
    return tuple(dict.fromkeys(words))


class StopText:
    """The stop strings of one request and the decoder that turns tokens into text."""

    def __init__(self, strings: Sequence[str], decode: Decode):
        self.strings = tuple(strings)
        self.decode = decode

    def find(self, generated: Sequence[int], start: int = 0) -> TextHit | None:
        """The earliest stop string in decode(generated) that ends in generated[start:].

        Text before ``start`` was searched already; only its last characters (a stop
        string may begin there) are decoded again, so a check costs the new tokens only.
        """
        tail = self._tail(generated, start)
        best = None
        for s in self.strings:
            i = tail.text.find(s)
            if i >= 0 and (best is None or (i, i + len(s)) < best):
                best = (i, i + len(s))
        if best is None:
            return None
        first, stop = best
        keep = tail.tokens_reaching(first)
        trim = tail.chars(keep) - first
        return TextHit(keep, max(0, trim), max(keep, tail.tokens_reaching(stop)))

    def safe_len(self, generated: Sequence[int]) -> int:
        """How many leading tokens have text that no later stop string can start in."""
        tail = self._tail(generated, len(generated))
        text = _complete(tail.text)
        boundary = len(text) - self._held_suffix(text)
        lo, hi = tail.first, len(generated)  # largest n with chars(n) <= boundary
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail.chars(mid) <= boundary:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _tail(self, generated: Sequence[int], start: int) -> "_Tail":
        """The text from a few tokens before ``start``: at least a stop string's length - 1
        characters before it (or everything)."""
        need = max((len(s) for s in self.strings), default=1) - 1
        back = need + CONTEXT_TOKENS
        while True:
            first = max(0, start - back)
            tail = _Tail(self.decode, generated, first)
            if first == 0 or (tail.valid and tail.chars(start) >= need):
                return tail if tail.valid else _Tail(self.decode, generated, 0)
            back *= 2

    def _held_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for s in self.strings:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest


class _Tail:
    """decode(generated[first:]) as the full decode has it (a few tokens of left context
    keep merges and multi-byte characters intact); positions count from ``first``."""

    def __init__(self, decode: Decode, generated: Sequence[int], first: int):
        self.decode, self.generated, self.first = decode, generated, first
        self.context = max(0, first - CONTEXT_TOKENS)
        before = decode(generated[self.context : first]) if first else ""
        whole = decode(generated[self.context :])
        self.pre = len(before)
        self.valid = not before.endswith(REPLACEMENT) and whole.startswith(before)
        self.text = whole[self.pre :]

    def chars(self, n: int) -> int:
        """Characters of decode(generated[first:n]) (n counts from the list's start)."""
        return len(self.decode(self.generated[self.context : n])) - self.pre

    def tokens_reaching(self, chars: int) -> int:
        """Fewest leading tokens whose (complete) text reaches ``chars`` tail characters."""
        lo, hi = self.first, len(self.generated)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(_complete(self.decode(self.generated[self.context : mid]))) - self.pre >= chars:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _complete(text: str) -> str:
    return text.rstrip(REPLACEMENT)


def first_stop(generated: Sequence[int], start: int, criteria: StopCriteria, text: StopText | None,
               min_keep: int = 0) -> Stop | None:
    """The earliest stop among the token rules and the stop strings; never keeps < min_keep.

    Token rules cut the list first; a stop string found in what remains ends earlier.
    ``min_keep`` (tokens already streamed) cannot be taken back; by construction a stop
    string never starts inside them, the clamp only guards that promise.
    """
    stop = find_stop(list(generated), start, criteria)
    if text is None:
        return stop
    hit = text.find(generated[: stop.keep], min(start, stop.keep)) if stop else text.find(generated, start)
    if hit is None:
        return stop
    keep, trim = hit.keep, hit.trim
    if keep < min_keep:
        cut_at = len(text.decode(generated[:keep])) - trim
        keep = min_keep
        trim = max(0, len(text.decode(generated[:keep])) - cut_at)
    return Stop(keep, "stop_words", max(hit.end, keep), trim)
