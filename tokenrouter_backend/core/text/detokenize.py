"""Incremental detokenization: the text a window of new token ids adds, never retracted.

The router sends, per response, a window of token ids whose first ``prefix_len`` tokens
were already covered by earlier responses (a few tokens of left context keep byte-level
BPE merges and multi-byte characters intact). The delta is decode(window) minus
decode(window[:prefix_len]); while a multi-byte character is incomplete (the decoder
yields U+FFFD at the end), it is held back until the tokens that complete it arrive. On the
final window, ``trim`` characters at the end (where a stop string began) are dropped.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 6  # tokens of left context the router repeats in each streamed window


class Detokenizer:
    """Wraps a ``tokenizers.Tokenizer`` (or anything with ``decode(ids, skip_special_tokens)``)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def delta(self, window, prefix_len: int, final: bool, trim: int = 0) -> str:
        before = _complete(self.decode(window[:prefix_len])) if prefix_len else ""
        text = self.decode(window)
        if trim > 0:
            text = text[: max(0, len(text) - trim)]
        if not final:
            text = _complete(text)
        if not text.startswith(before):
            # a merge across the boundary changed earlier text: emit only what is new
            common = _common_prefix_len(before, text)
            return text[max(common, len(before)) :] if len(text) > len(before) else ""
        return text[len(before) :]


def stream_window(all_tokens: list[int], sent: int) -> tuple[list[int], int]:
    """The window to send when ``sent`` tokens were already covered: (window, prefix_len)."""
    start = max(0, sent - CONTEXT_TOKENS)
    return all_tokens[start:], sent - start


def _complete(text: str) -> str:
    """Drop a trailing incomplete multi-byte character (decoded as U+FFFD)."""
    return text.rstrip(REPLACEMENT)


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
