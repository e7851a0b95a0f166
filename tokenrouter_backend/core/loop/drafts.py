"""One block's proposed tokens, whoever proposed them: the ``Drafts`` value.

Every proposer (``proposers.py``: the light model drafting token by token, the light model
reading a copy, an n-gram lookup or an earlier answer) returns a ``Drafts``; the acceptance
rule (``acceptance.verify``) and route's gate read it without asking where it came from.
Words used throughout the loop: a *draft* is a proposed token; it is *accepted* when it
stands after the heavy model's check (or the gate let it stand unchecked).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from tokenrouter_backend.core.protocol.names import Source


class DraftSource(str, Enum):
    """Who proposed a block's drafts (``RequestStats`` counts each apart)."""

    LIGHT = "light"  # the light model, one forward per token
    COPY = "copy"  # the light model reading an n-gram copy in one forward (route, greedy)
    NGRAM = "ngram"  # the latest earlier occurrence of the text's last n tokens, no model
    ANSWER = "answer"  # the earlier answer to the same prompt (the decision cache), no model

    @property
    def model_free(self) -> bool:
        return self in (DraftSource.NGRAM, DraftSource.ANSWER)

    @property
    def token_source(self) -> Source:
        """The ``Source`` of a committed draft: a model-free one is ``ngram``, any other ``light``."""
        return Source.NGRAM if self.model_free else Source.LIGHT


@dataclass(frozen=True)
class Drafts:
    """Proposed tokens and what their proposer said of each."""

    tokens: np.ndarray  # int32 [d]
    source: DraftSource
    confidence: np.ndarray | None = None  # float32 [d]: top-1 (or sampled token's) probability; None: no model
    entropy: np.ndarray | None = None  # float32 [d] (nats); None: no model
    margin: np.ndarray | None = None  # float32 [d] top-1 minus top-2; None when unknown
    q: np.ndarray | None = None  # float32 [d, V] proposal distributions (sampling); None: deterministic

    @classmethod
    def none(cls, source: DraftSource) -> "Drafts":
        return cls(np.zeros(0, np.int32), source)

    @classmethod
    def of_tokens(cls, tokens, source: DraftSource) -> "Drafts":
        """Deterministic drafts (n-gram, earlier answer): no scores, a one-hot proposal."""
        return cls(np.asarray(tokens, np.int32).reshape(-1), source)

    @classmethod
    def of_step(cls, step, source: DraftSource = DraftSource.LIGHT) -> "Drafts":
        """The drafts of a drafting ``branch_view.Step`` (its proposal distributions when returned)."""
        dist = step.result.dist
        return cls(step.drafts, source, step.draft_probs, step.draft_entropy, step.draft_margin,
                   None if dist is None else dist[-len(step.drafts):])

    def __len__(self) -> int:
        return len(self.tokens)

    def __add__(self, more: "Drafts") -> "Drafts":
        """These drafts followed by ``more`` (proposed after them), under this source."""
        return Drafts(np.concatenate([self.tokens, more.tokens]), self.source,
                      _join(self.confidence, more.confidence), _join(self.entropy, more.entropy),
                      _join(self.margin, more.margin), _join(self.q, more.q))

    def tail(self, start: int) -> "Drafts":
        """The drafts from index ``start`` on."""
        return Drafts(self.tokens[start:], self.source, _cut(self.confidence, start), _cut(self.entropy, start),
                      _cut(self.margin, start), _cut(self.q, start))


def _cut(a: np.ndarray | None, start: int) -> np.ndarray | None:
    return None if a is None else a[start:]


def _join(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else np.concatenate([a, b])
