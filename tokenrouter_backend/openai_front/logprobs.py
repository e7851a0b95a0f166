"""OpenAI's ``logprobs`` objects from the router's log-probability outputs.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``;
completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``.
With ``echo`` the prompt's tokens come first, the first of them with null numbers (as
OpenAI's). Each token's text is the served tokenizer's decoding of that one token (as vLLM writes it;
a token holding part of a UTF-8 character decodes to U+FFFD) and its ``bytes`` the token's
own bytes (a byte-level BPE token's exact bytes). The extension field ``branch`` (chat, per
token) / ``branches`` (completions, per choice) says whose number it is: ``heavy``,
``light`` (a route draft that stood unchecked), or null for a token no model scored, whose
number is ``NO_LOGPROB``, vLLM's stand-in for minus infinity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

NO_LOGPROB = -9999.0  # vLLM's floor for a log-probability that is not a finite number


@dataclass(frozen=True)
class TokenScores:
    """One answer token as the router reported it."""

    token: int
    logprob: Optional[float]  # None: a prompt's first token (nothing before it to score it)
    branch: str  # "heavy" / "light" / "" (no model scored it)
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class TokenText:
    """Token id -> its text and bytes under the served tokenizer (cached)."""

    tokenizer: object
    _byte_of: dict = field(default_factory=dict)

    def __post_init__(self):
        try:
            from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
            self._byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        except ImportError:  # no byte-level table: bytes of the decoded text
            self._byte_of = {}
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _bytes(self, token: int) -> list[int]:
        symbol = self.tokenizer.convert_ids_to_tokens(token)
        if isinstance(symbol, str) and symbol and all(ch in self._byte_of for ch in symbol):
            return [self._byte_of[ch] for ch in symbol]
        return list(self.text(token).encode("utf-8"))


def _number(lp: Optional[float]) -> Optional[float]:
    return lp if lp is None or math.isfinite(lp) else NO_LOGPROB


def chat_logprobs(entries: list[TokenScores], words: TokenText, top: int) -> dict:
    """A chat choice's (or chunk's) ``logprobs`` for ``entries``; ``top`` alternatives each."""
    def item(token: int, lp: float) -> dict:
        return {"token": words.text(token), "logprob": _number(lp), "bytes": words.bytes(token)}

    content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top[:top]],
                "branch": e.branch or None} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenScores], words: TokenText, top: int, offset: int) -> dict:
    """A completion choice's (or chunk's) ``logprobs``; ``offset``: the text offset of the first token."""
    tokens = [words.text(e.token) for e in entries]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [_number(e.logprob) for e in entries],
        "top_logprobs": [None if e.logprob is None else {words.text(t): _number(lp) for t, lp in e.top[:top]}
                         for e in entries],
        "text_offset": offsets,
        "branches": [e.branch or None for e in entries],
    }


def next_offset(logprobs: Optional[dict]) -> int:
    """The text offset after a completion chunk's tokens (where the next chunk's start)."""
    if not logprobs or not logprobs["tokens"]:
        return 0
    return logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
