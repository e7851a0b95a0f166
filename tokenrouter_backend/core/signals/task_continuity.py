"""Task continuity: which adjacent prompt segments belong to one task (prompt_segments groups).

Two adjacent segments continue one task when they share a link key: a content word (a word
of >= ``MIN_WORD`` letters after lowercasing, not in ``STOP_WORDS``) or an identifier (in a
code segment every identifier of >= ``MIN_IDENTIFIER`` characters that is not a keyword;
in prose a `backticked` name or a word with ``_`` / a digit). Lowercased throughout, so
prose "total" links code ``total = 0``. Runs of linked neighbours form one group.
"""
from __future__ import annotations

import re
from typing import Sequence

MIN_WORD = 4  # prose content words this long or longer link segments
MIN_IDENTIFIER = 3  # code identifiers this long or longer (x, i, df are too common)
STOP_WORDS = frozenset("""
about above after again also always among another anything back been before being below between both
could does doing done down each even ever every from give have having here into just keep know like
make many more most much must need never only other over please really same shall should show some
such sure than that their them then there these they thing this those through very want well were
what when where which while will with within without would your yours exactly least ensure required
""".split())
CODE_KEYWORDS = frozenset("""
and are as assert async await break case catch class const continue def del elif else except export
false final finally for from function global if import in is lambda let new none nonlocal not null or
pass raise return self static switch this throw true try typeof undefined var void while with yield
""".split())
_WORD = re.compile(r"[a-z]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BACKTICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`")
_CODE_LIKE = re.compile(r"\b[A-Za-z]*(?:_[A-Za-z0-9]*|\d)[A-Za-z0-9_]*\b")


def link_keys(text: str, code: bool) -> frozenset[str]:
    """The words and identifiers by which ``text`` links to a neighbouring segment."""
    if code:
        return frozenset(w.lower() for w in _IDENTIFIER.findall(text)
                         if len(w) >= MIN_IDENTIFIER and w.lower() not in CODE_KEYWORDS)
    lower = text.lower()
    words = {w for w in _WORD.findall(lower) if len(w) >= MIN_WORD and w not in STOP_WORDS}
    names = {m.lower() for m in _BACKTICKED.findall(text)}
    names |= {m.lower() for m in _CODE_LIKE.findall(text) if re.search(r"[A-Za-z]", m) and len(m) >= 2}
    return frozenset(words | names)


def group_runs(keys: Sequence[frozenset[str]]) -> list[range]:
    """Consecutive index ranges whose neighbours share a key (every index in exactly one)."""
    runs: list[range] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or not keys[i - 1] & keys[i]:
            runs.append(range(start, i))
            start = i
    return runs
