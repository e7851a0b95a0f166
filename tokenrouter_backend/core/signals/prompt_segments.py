"""Prompt segments and their difficulty: the request-level routing signal (rules, light perplexity).

``segments`` cuts a prompt into fenced code blocks, JSON values, and prose split at newlines
and sentence punctuation; a segment longer than ``MAX_SEGMENT_CHARS`` is split further at
whitespace. ``difficulty`` scores one segment in [0, 1] from rules:

  code         code markers (def / class / return / import / braces / operators): +0.35
  math         numbers with arithmetic or comparison, or words like calculate / sum / how many: +0.35
  question     question words or a question mark: +0.15
  constraints  must / exactly / at least / at most / only / never / should / ensure: +0.25

(capped at 1). With the light model's surprise at the prompt (``core/prompt_surprise``:
per-token NLL, and each token's end in the prompt text), a segment also gets

  perplexity   weight x clip((mean NLL of its tokens - nll_easy) / (nll_hard - nll_easy), 0, 1)

(``PerplexityRule``; a segment with no scored token gets none). Adjacent segments that
continue one task (a shared content word or identifier, ``task_continuity``) form a group,
scored as one text (its perplexity term from all its tokens): a hard instruction split
across two sentences is scored whole, not as two milder pieces. ``score_prompt`` sums a
prompt up over its segments, each counted at its group's difficulty: the hardest, the
mean, the segments at or above the critical level, and the whole prompt's own score
(rules that fire anywhere in it add up there, plus the term of the mean NLL of all scored
tokens).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.signals.prompt_surprise import PromptSurprise
from tokenrouter_backend.core.signals.task_continuity import group_runs, link_keys

MAX_SEGMENT_CHARS = 240
CRITICAL_LEVEL = 0.6  # a segment this hard makes the request critical
_FENCE = re.compile(r"```[^\n]*\n.*?(?:```|$)", re.S)
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+")
_CODE = re.compile(r"\b(def|class|return|import|lambda|function|const|let|var|for|while|if)\b"
                   r"|[{}();]|==|!=|<=|>=|->|=>")
_NUMBER_OP = re.compile(r"\d\s*[-+*/%^=<>]\s*\d|\d+\s*(percent|%)")
_MATH_WORDS = re.compile(r"\b(calculate|compute|sum|product|how many|how much|average|total|percent|"
                         r"divide|multiply|equation|solve|integer|prime)\b", re.I)
_QUESTION = re.compile(r"\?|\b(what|why|how|which|when|where|who|explain)\b", re.I)
_CONSTRAINT = re.compile(r"\b(must|exactly|at least|at most|no more than|only|never|always|should|ensure|"
                         r"do not|don't|required?)\b", re.I)


class SegmentKind(str, Enum):
    CODE = "code"
    JSON = "json"
    TEXT = "text"


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    text: str
    difficulty: float


def _split_long(text: str) -> list[str]:
    out, rest = [], text
    while len(rest) > MAX_SEGMENT_CHARS:
        cut = rest.rfind(" ", 0, MAX_SEGMENT_CHARS)
        cut = cut if cut > 0 else MAX_SEGMENT_CHARS
        out.append(rest[:cut])
        rest = rest[cut:].lstrip()
    return out + ([rest] if rest else [])


def _is_json(text: str) -> bool:
    t = text.strip()
    if not t or t[0] not in "[{":
        return False
    try:
        json.loads(t)
    except ValueError:
        return False
    return True


def difficulty(text: str, kind: SegmentKind = SegmentKind.TEXT) -> float:
    score = 0.35 if kind == SegmentKind.CODE or len(_CODE.findall(text)) >= 2 else 0.0
    score += 0.35 if _NUMBER_OP.search(text) or _MATH_WORDS.search(text) else 0.0
    score += 0.15 if _QUESTION.search(text) else 0.0
    score += 0.25 if _CONSTRAINT.search(text) else 0.0
    return min(1.0, score)


def segments(prompt: str) -> list[Segment]:
    out: list[Segment] = []
    pos = 0
    for m in _FENCE.finditer(prompt):
        out += _prose(prompt[pos : m.start()])
        out += [Segment(SegmentKind.CODE, p, difficulty(p, SegmentKind.CODE)) for p in _split_long(m.group(0))]
        pos = m.end()
    return out + _prose(prompt[pos:])


def _prose(text: str) -> list[Segment]:
    if _is_json(text):
        return [Segment(SegmentKind.JSON, p, difficulty(p, SegmentKind.JSON)) for p in _split_long(text.strip())]
    out = []
    for piece in _SENTENCE.split(text):
        for p in _split_long(piece.strip()):
            if p:
                out.append(Segment(SegmentKind.TEXT, p, difficulty(p)))
    return out


@dataclass(frozen=True)
class PerplexityRule:
    """How the light model's NLL on a segment adds to its difficulty (config request_nll_*)."""

    nll_easy: float = 1.0  # mean NLL (nats) at or below which a segment adds nothing
    nll_hard: float = 3.0  # ... at or above which it adds the whole weight
    weight: float = 0.3

    def term(self, nll: float) -> float:
        if math.isnan(nll):
            return 0.0
        return self.weight * min(1.0, max(0.0, (nll - self.nll_easy) / (self.nll_hard - self.nll_easy)))


@dataclass(frozen=True)
class TokenSurprise:
    """The light model's NLL per prompt token (``PromptSurprise``) and where each token's text ends."""

    surprise: PromptSurprise
    ends: np.ndarray  # int [n]: character offset in the prompt text just past each token

    @property
    def nll(self) -> np.ndarray:
        return self.surprise.nll

    @classmethod
    def on_text(cls, surprise: PromptSurprise, token_texts: Sequence[str]) -> "TokenSurprise":
        """Placed by each token's decoded text (offsets add up; exact where tokens decode to whole characters)."""
        return cls(surprise, np.cumsum([len(t) for t in token_texts], dtype=np.int64))

    @classmethod
    def of(cls, nll: Sequence[float], token_texts: Sequence[str]) -> "TokenSurprise":
        """From per-token NLL values (NaN = not scored) and each token's decoded text."""
        return cls.on_text(PromptSurprise(np.asarray(nll, np.float64)), token_texts)


def segment_spans(prompt: str, segs: Sequence[Segment]) -> list[tuple[int, int]]:
    """Each segment's (start, end) in ``prompt`` (segments are substrings, in order)."""
    spans, pos = [], 0
    for seg in segs:
        start = prompt.find(seg.text, pos)
        start = pos if start < 0 else start
        spans.append((start, start + len(seg.text)))
        pos = start + len(seg.text)
    return spans


def segment_nll(prompt: str, segs: Sequence[Segment], surprise: TokenSurprise) -> list[tuple[float, int]]:
    """(sum of NLL, scored tokens) per segment: a token belongs to the segment its last character is in."""
    out = []
    for start, end in segment_spans(prompt, segs):
        lo, hi = np.searchsorted(surprise.ends, [start + 1, end + 1])
        values = surprise.nll[lo:hi]
        values = values[~np.isnan(values)]
        out.append((float(values.sum()), int(len(values))))
    return out


@dataclass(frozen=True)
class Group:
    """Adjacent segments of one task, scored as one text."""

    members: range  # indices into segments(prompt)
    kind: SegmentKind  # code if any member is code, json if all are, else text
    text: str
    difficulty: float


def groups(segs: list[Segment], nll: Sequence[tuple[float, int]] | None = None,
           rule: PerplexityRule = PerplexityRule()) -> list[Group]:
    """Task-continuity groups; with ``nll`` (``segment_nll``) each group's difficulty also
    carries the perplexity term of its tokens' mean NLL."""
    out = []
    for run in group_runs([link_keys(s.text, s.kind != SegmentKind.TEXT) for s in segs]):
        kinds = {segs[i].kind for i in run}
        kind = (SegmentKind.CODE if SegmentKind.CODE in kinds
                else SegmentKind.JSON if kinds == {SegmentKind.JSON} else SegmentKind.TEXT)
        text = "\n".join(segs[i].text for i in run)
        score = segs[run[0]].difficulty if len(run) == 1 else difficulty(text, kind)
        if nll is not None:
            total, count = (sum(nll[i][k] for i in run) for k in (0, 1))
            score = min(1.0, score + rule.term(total / count if count else math.nan))
        out.append(Group(run, kind, text, score))
    return out


@dataclass(frozen=True)
class PromptScore:
    hardest: float
    mean: float
    critical_segments: int
    segments: int
    whole: float = 0.0  # difficulty(prompt) as one text
    groups: int = 0  # task-continuity groups the segments form
    nll: float = math.nan  # mean light-model NLL over the scored prompt tokens (NaN: not measured)
    nll_tokens: int = 0  # how many tokens that mean covers


def score_prompt(prompt: str, surprise: TokenSurprise | None = None,
                 rule: PerplexityRule = PerplexityRule()) -> PromptScore:
    """The prompt's score from its segments (rules), plus the perplexity term with ``surprise``."""
    segs = segments(prompt)
    if not segs:
        return PromptScore(0.0, 0.0, 0, 0)
    nll = segment_nll(prompt, segs, surprise) if surprise is not None else None
    grouped = groups(segs, nll, rule)
    values = [g.difficulty for g in grouped for _ in g.members]  # each segment at its group's score
    whole = difficulty(prompt)
    mean_nll, scored = math.nan, 0
    if surprise is not None:
        mean_nll, scored = surprise.surprise.mean, surprise.surprise.scored
        whole = min(1.0, whole + rule.term(mean_nll))
    return PromptScore(max(values), sum(values) / len(values), sum(v >= CRITICAL_LEVEL for v in values), len(segs),
                       whole, len(grouped), mean_nll, scored)
