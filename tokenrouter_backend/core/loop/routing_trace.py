"""Where each generated token came from, for ``--show-routing`` and the replay page.

``Kind`` is one character per token (``RequestStats.token_kinds``): light committed
unchecked, light verified by the heavy model before it was committed, the heavy model's
own token, and the heavy token that replaced rolled-back light tokens. ``runs`` groups an
answer into (kind, text) runs, decoding only at run boundaries (text of a prefix, so
multi-byte characters split over tokens stay whole).
"""
from __future__ import annotations

from enum import Enum
from typing import Callable, Sequence

from tokenrouter_backend.core.protocol.names import Mode, Source


class Kind(str, Enum):
    LIGHT_UNCHECKED = "u"
    LIGHT_VERIFIED = "v"
    HEAVY = "h"
    ROLLED_BACK = "r"
    COPIED = "c"  # a model-free draft (n-gram copy, the decision cache's earlier answer) the heavy model accepted

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {Kind.LIGHT_UNCHECKED: "light, unchecked", Kind.LIGHT_VERIFIED: "light, verified",
          Kind.HEAVY: "heavy", Kind.ROLLED_BACK: "heavy after a rollback",
          Kind.COPIED: "copied (n-gram or earlier answer), verified"}


def default_kind(source: Source, mode: Mode) -> Kind:
    """A committed token's kind when the commit site does not say: verify checks every light
    token before committing it; light and route commit light tokens unchecked."""
    if source == Source.HEAVY:
        return Kind.HEAVY
    if source == Source.NGRAM:
        return Kind.COPIED
    assert source == Source.LIGHT, source
    return Kind.LIGHT_VERIFIED if mode == Mode.VERIFY else Kind.LIGHT_UNCHECKED


def runs(tokens: Sequence[int], kinds: str, decode: Callable[[Sequence[int]], str]) -> list[tuple[str, str]]:
    """[(kind, text)] for consecutive tokens of one kind; their texts join to decode(tokens)."""
    out: list[tuple[str, str]] = []
    n = min(len(tokens), len(kinds))
    start, before = 0, ""
    for i in range(1, n + 1):
        if i < n and kinds[i] == kinds[start]:
            continue
        text = decode(tokens[:i])
        out.append((kinds[start], text[len(before):] if text.startswith(before) else text))
        start, before = i, text
    return out


def routing_runs(tokens: Sequence[int], kinds: str, decode: Callable[[Sequence[int]], str],
                 trim: int = 0) -> list[list[str]]:
    """JSON-ready runs of a final answer: ``trim`` characters (a stop string) cut off the end."""
    out = [[k, t] for k, t in runs(tokens, kinds, decode)]
    while trim > 0 and out:
        cut = min(trim, len(out[-1][1]))
        out[-1][1] = out[-1][1][: len(out[-1][1]) - cut]
        trim -= cut
        if not out[-1][1]:
            out.pop()
    return out
