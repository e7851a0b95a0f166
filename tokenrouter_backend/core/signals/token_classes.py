"""Critical-token classes: what kind of token a light draft is, from its text alone.

Every vocabulary entry gets a base class once, from its decoded text (``VocabClasses``);
a drafted token's class also looks at the token before it (the first token of a line, the
name after ``def`` / ``class``). Precedence, highest first:

  END         a token that ends the answer (end_id, document ends)
  NUMBER      digits and numeric literals (``3``, ``0.5``, ``1e-3``)
  OPERATOR    operators and comparisons (``+``, ``==``, ``<=``, ``%``, ``**``, ``->``)
  LOGIC       control-flow and boolean keywords (``if``, ``return``, ``and``, ``None``...)
  DEFINITION  an identifier being defined (the token after def / class / function / let...)
  LINE_START  the first token of a line (after a newline)
  PLAIN       everything else
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

import numpy as np


class TokenClass(IntEnum):
    PLAIN = 0
    END = 1
    NUMBER = 2
    OPERATOR = 3
    LOGIC = 4
    DEFINITION = 5
    LINE_START = 6

    @property
    def key(self) -> str:
        return self.name.lower()


CLASS_NAMES = tuple(c.key for c in TokenClass)
LOGIC_WORDS = frozenset(
    "if elif else for while return yield break continue and or not in is True False None try except "
    "raise assert with switch case default null true false".split())
DEFINING_WORDS = frozenset("def class function fn func let const var struct enum interface lambda".split())
_NUMBER = re.compile(r"^\s*[-+]?(\d[\d_]*\.?\d*([eE][-+]?\d+)?|\.\d+|0[xXbBoO][0-9a-fA-F_]+)\s*$")
_DIGIT = re.compile(r"\d")
_OPERATOR = re.compile(r"^\s*([-+*/%=<>!&|^~@]+|->|::)\s*$")


def base_class(text: str) -> TokenClass:
    """The class of one vocabulary entry's text, before context."""
    word = text.strip()
    if not word:
        return TokenClass.PLAIN
    if _NUMBER.match(text) or (_DIGIT.search(word) and not any(ch.isalpha() for ch in word)):
        return TokenClass.NUMBER
    if _OPERATOR.match(text):
        return TokenClass.OPERATOR
    if word in LOGIC_WORDS:
        return TokenClass.LOGIC
    return TokenClass.PLAIN


def ends_line(text: str) -> bool:
    """The text ends a line: a newline, then nothing but spaces or tabs."""
    return "\n" in text and not text[text.rindex("\n") + 1 :].strip()


@dataclass(frozen=True)
class VocabClasses:
    """Per-vocabulary-id base class and context flags, built once from the decoded texts."""

    base: np.ndarray  # int8 [V]: TokenClass of the text alone
    line_end: np.ndarray  # bool [V]: the token ends a line (the next token starts one)
    defining: np.ndarray  # bool [V]: the token is a defining keyword (def, class, ...)

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> "VocabClasses":
        base = np.fromiter((base_class(t) for t in texts), np.int8, len(texts))
        line_end = np.fromiter((ends_line(t) for t in texts), bool, len(texts))
        defining = np.fromiter((t.strip() in DEFINING_WORDS for t in texts), bool, len(texts))
        return cls(base, line_end, defining)

    def classify(self, previous: int | None, drafts: Sequence[int], end_tokens: frozenset[int] = frozenset()
                 ) -> np.ndarray:
        """int8 [len(drafts)]: each draft's class, ``previous`` being the token before drafts[0]."""
        out = np.zeros(len(drafts), np.int8)
        prev = previous
        for i, tok in enumerate(int(t) for t in drafts):
            out[i] = self._one(prev, tok, end_tokens)
            prev = tok
        return out

    def _one(self, prev: int | None, tok: int, end_tokens: frozenset[int]) -> TokenClass:
        if tok in end_tokens:
            return TokenClass.END
        if not 0 <= tok < len(self.base):
            return TokenClass.PLAIN
        base = TokenClass(int(self.base[tok]))
        if base != TokenClass.PLAIN:
            return base
        known = prev is not None and 0 <= prev < len(self.base)
        if known and self.defining[prev]:
            return TokenClass.DEFINITION
        if known and self.line_end[prev]:
            return TokenClass.LINE_START
        return TokenClass.PLAIN
