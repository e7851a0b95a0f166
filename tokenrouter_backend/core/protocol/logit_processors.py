"""Logit processors: what a request asks the branches to do to every row of logits before a
token is chosen — OpenAI's ``presence_penalty`` / ``frequency_penalty`` and ``logit_bias``,
vLLM's ``repetition_penalty`` and ``min_tokens``.

One rule for both branches at every scored position, so the light model drafts under the
same processors the heavy model checks with, and verify stays token-identical to heavy-only
(greedy) and distributed as heavy-only sampling (sampled). The processors read the tokens
before the row's position: a row at sequence position q counts the answer's tokens at
positions ``answer_start`` … q - 1 (presence / frequency, OpenAI's definition: the generated
text), also the prompt's distinct tokens for the repetition penalty (vLLM's: prompt and
output), and suppresses ``ends`` while q - ``answer_start`` < ``min_tokens``. A branch step
carries the answer tokens its session already holds (``history``); its inputs and drafts
add the rest row by row, so a check scores every draft under the state the draft itself
would have met, and a rejected draft's counts vanish with it (nothing is kept between steps).

Order (vLLM's): repetition penalty on the raw logits, then frequency and presence, then the
bias, then ``min_tokens``; temperature, top-k and top-p follow in sampling. Log-probabilities
(``BranchOp.logprobs``) stay the raw model's.

Over Triton the processors travel as one JSON string (``to_json`` / ``from_json``), checked
on arrival like any branch input.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAX_BIAS_ENTRIES = 300  # OpenAI's logit_bias limit
MAX_LIST = 1 << 17  # history / prompt tokens / ends carried by one step
PENALTY_RANGE = (-2.0, 2.0)  # presence and frequency (OpenAI)
REPETITION_RANGE = (0.01, 10.0)  # vLLM allows (0, 2] in practice; > 0 required
BIAS_RANGE = (-100.0, 100.0)  # OpenAI


@dataclass(frozen=True)
class LogitProcessors:
    """The processors of one request (and, per step, the answer tokens its session holds)."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0  # 1 = off
    bias: tuple[tuple[int, float], ...] = ()  # token id -> added to its logit
    min_tokens: int = 0  # ends are suppressed until the answer has this many tokens
    ends: tuple[int, ...] = ()  # the tokens that end an answer (min_tokens suppresses them)
    answer_start: int = 0  # sequence index of the answer's first token
    prompt_seen: tuple[int, ...] = ()  # repetition: the prompt's distinct tokens
    history: tuple[int, ...] = ()  # per step: the answer's tokens before the step's inputs

    @property
    def active(self) -> bool:
        return bool(self.presence or self.frequency or self.repetition != 1.0 or self.bias or self.min_tokens)

    def counting(self) -> bool:
        """Whether rows need the counts of earlier tokens."""
        return bool(self.presence or self.frequency or self.repetition != 1.0)

    def to_json(self) -> str:
        return json.dumps({"presence": self.presence, "frequency": self.frequency, "repetition": self.repetition,
                           "bias": [list(b) for b in self.bias], "min_tokens": self.min_tokens,
                           "ends": list(self.ends), "answer_start": self.answer_start,
                           "prompt_seen": list(self.prompt_seen), "history": list(self.history)},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, vocab: int | None = None) -> "LogitProcessors":
        """Parse and check (``ValueError`` naming the field); ``vocab`` bounds every token id."""
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"logit_processors is not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError("logit_processors must be a JSON object")
        out = cls(presence=_number(d, "presence", 0.0, *PENALTY_RANGE),
                  frequency=_number(d, "frequency", 0.0, *PENALTY_RANGE),
                  repetition=_number(d, "repetition", 1.0, *REPETITION_RANGE),
                  bias=tuple((_token(t, "bias", vocab), _in_range(float(v), "bias", *BIAS_RANGE))
                             for t, v in _list(d, "bias", MAX_BIAS_ENTRIES, pairs=True)),
                  min_tokens=int(_number(d, "min_tokens", 0, 0, 1 << 20)),
                  ends=tuple(_token(t, "ends", vocab) for t in _list(d, "ends", MAX_LIST)),
                  answer_start=int(_number(d, "answer_start", 0, 0, 1 << 30)),
                  prompt_seen=tuple(_token(t, "prompt_seen", vocab) for t in _list(d, "prompt_seen", MAX_LIST)),
                  history=tuple(_token(t, "history", vocab) for t in _list(d, "history", MAX_LIST)))
        return out


def _in_range(value: float, name: str, low: float, high: float) -> float:
    if math.isnan(value) or not low <= value <= high:
        raise ValueError(f"logit_processors.{name} must be in [{low}, {high}]; got {value}")
    return value


def _number(d: dict, name: str, default, low, high):
    value = d.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"logit_processors.{name} must be a number; got {value!r}")
    return _in_range(float(value), name, low, high)


def _list(d: dict, name: str, most: int, pairs: bool = False) -> list:
    value = d.get(name, [])
    if not isinstance(value, list) or len(value) > most:
        raise ValueError(f"logit_processors.{name} must be a list of at most {most} entries")
    if pairs and not all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], (int, float))
                         and not isinstance(p[1], bool) for p in value):
        raise ValueError(f"logit_processors.{name} must hold [token id, number] pairs")
    return value


def _token(value, name: str, vocab: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (vocab is not None and value >= vocab):
        raise ValueError(f"logit_processors.{name} holds {value!r}, not a token id in [0, {vocab or 'vocab'})")
    return value


def processors_from_input(arr) -> LogitProcessors | None:
    """A branch's ``logit_processors`` input (absent or empty: none); token ids are bounded by
    the engine (``check_op``), which knows the vocabulary."""
    if arr is None or arr.size == 0:
        return None
    raw = arr.reshape(-1)[0]
    try:
        return LogitProcessors.from_json(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"branch input {exc}") from None
