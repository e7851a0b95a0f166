"""Chat content stays content: special-token text inside a message is tokenized as text.

A chat prompt is the chat template's text with the messages' contents in it. ``content_spans``
marks where the contents are (character offsets into the prompt, a flat ``[start, end, ...]``
list). ``encode_prompt`` tokenizes the prompt as a whole — ids identical to a plain encode —
unless a special token (``<|im_end|>``, ``<|endoftext|>``...) would come from content, or
straddle content and template: then each piece is tokenized alone, the template's pieces
with special tokens recognized and the contents' with special tokens as plain text
(``tokenizers``' ``encode_special_tokens``), and the pieces joined. So a user writing
``hi<|im_end|>\\n<|im_start|>system`` gets those characters as text, never a forged turn.

Works on a ``tokenizers.Tokenizer`` (duck-typed: ``encode``, ``post_process``; ``merge`` is
``tokenizers.Encoding.merge``).
"""
from __future__ import annotations

from typing import Callable, Sequence

from tokenrouter_backend.core.protocol.params import InvalidRequest

MAX_CONTENT_SPANS = 4096  # spans one prompt may mark (two ints each): a cap refused by name


def parse_spans(values: Sequence[int], text_length: int) -> list[tuple[int, int]]:
    """``content_spans`` as sorted, disjoint (start, end) pairs inside the prompt; InvalidRequest otherwise."""
    if len(values) > 2 * MAX_CONTENT_SPANS:  # before any per-value work
        raise InvalidRequest(f"content_spans has {len(values) // 2} spans; at most {MAX_CONTENT_SPANS} allowed")
    if len(values) % 2:
        raise InvalidRequest(f"content_spans must hold (start, end) pairs; got {len(values)} values")
    values = [int(v) for v in values]
    spans, last = [], 0
    for start, end in zip(values[::2], values[1::2]):
        if not last <= start <= end <= text_length:
            raise InvalidRequest(f"content_spans must be sorted, disjoint character ranges within text_input "
                                 f"(0..{text_length}); got ({start}, {end}) after {last}")
        spans.append((start, end))
        last = end
    return spans


def _overlaps(span: tuple[int, int], spans: Sequence[tuple[int, int]]) -> bool:
    a, b = span
    return any(a < end and start < b for start, end in spans)


def encode_prompt(tokenizer, literal, text: str, spans: Sequence[tuple[int, int]], special_ids: set[int],
                  merge: Callable, add_special_tokens: bool = True) -> list[int]:
    """The prompt's token ids with no special token made of content.

    ``tokenizer`` recognizes special tokens, ``literal`` is the same tokenizer with
    ``encode_special_tokens`` set (special-token text split as plain text);
    ``add_special_tokens``: the tokenizer's post-processor adds its own (BOS...)."""
    whole = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    spans = [s for s in spans if s[0] < s[1]]
    forged = any(i in special_ids and _overlaps(off, spans) for i, off in zip(whole.ids, whole.offsets))
    if not forged:
        return list(whole.ids)
    pieces, at = [], 0
    for start, end in spans:
        if at < start:
            pieces.append(tokenizer.encode(text[at:start], add_special_tokens=False))
        pieces.append(literal.encode(text[start:end], add_special_tokens=False))
        at = end
    if at < len(text):
        pieces.append(tokenizer.encode(text[at:], add_special_tokens=False))
    merged = merge(pieces, growing_offsets=True)
    return list(tokenizer.post_process(merged, add_special_tokens=add_special_tokens).ids)
