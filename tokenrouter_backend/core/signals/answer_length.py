"""How long the rest of an answer will be, learned from the server's recent answers.

The cost model's light decision weighs the light prefill against what drafting saves over
the rest of the answer. ``max_tokens`` is a poor guess of that rest: a chat client asks for
256 tokens and gets a 12-token sentence. ``AnswerLengths`` keeps the lengths of recent
finished answers per workload signal the router can see before generating:

* ``max_tokens`` and the prompt length, each as a power-of-two bucket;
* the prompt's last token: a chat template ends every prompt with the same assistant-turn
  opening, a completion prompt with its own text, so chat and completion traffic (and
  different chat templates) keep apart without being told.

``expected_remaining(signal, generated, max_tokens)`` is the mean of ``min(L, max_tokens) -
generated`` over the recent answers of length L > ``generated`` — the rest of this answer
given that it has not ended yet. The fine key (all three signals) answers once it holds
``min_answers`` such answers, else the coarse one (the two buckets), else ``max_tokens -
generated`` (no evidence: the answer may run to its limit). An answer cut by ``max_tokens`` is
recorded at that length, which is what ``min(L, max_tokens)`` asks for. Framework-free; the
router owns one and feeds it every finished request.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

DEFAULT_WINDOW = 64  # recent answers kept per key
DEFAULT_MIN_ANSWERS = 4  # answers longer than the current length before a key's mean is used
MAX_KEYS = 512  # keys kept (least recently used go first)


@dataclass(frozen=True)
class LengthSignal:
    """What the router sees of a request before it generates (see the module docstring)."""

    max_tokens_bucket: int
    prompt_bucket: int
    last_token: int

    @classmethod
    def of(cls, prompt: tuple[int, ...] | list[int], max_tokens: int) -> "LengthSignal":
        return cls(_bucket(max_tokens), _bucket(len(prompt)), int(prompt[-1]) if len(prompt) else -1)

    @property
    def coarse(self) -> tuple[int, int]:
        return self.max_tokens_bucket, self.prompt_bucket


def _bucket(n: int) -> int:
    """0 for n <= 1, else the number of bits of n - 1 (1, 2, 3-4, 5-8, 9-16, ... share a bucket)."""
    return max(0, int(n) - 1).bit_length()


class AnswerLengths:
    """Recent answer lengths per ``LengthSignal`` (fine) and per its buckets (coarse)."""

    def __init__(self, window: int = DEFAULT_WINDOW, min_answers: int = DEFAULT_MIN_ANSWERS,
                 max_keys: int = MAX_KEYS):
        if window < 1 or min_answers < 1 or max_keys < 1:
            raise ValueError(f"invalid AnswerLengths(window={window}, min_answers={min_answers}, max_keys={max_keys})")
        self.window, self.min_answers, self.max_keys = window, min_answers, max_keys
        self._lengths: OrderedDict[object, deque[int]] = OrderedDict()

    def observe(self, signal: LengthSignal, length: int) -> None:
        """A finished answer of ``length`` generated tokens."""
        for key in (signal, signal.coarse):
            lengths = self._lengths.pop(key, None) or deque(maxlen=self.window)
            lengths.append(int(length))
            self._lengths[key] = lengths
        while len(self._lengths) > self.max_keys:
            self._lengths.popitem(last=False)

    def expected_remaining(self, signal: LengthSignal, generated: int, max_tokens: int) -> float:
        """Expected tokens still to come of an answer that has ``generated`` tokens and has not ended."""
        room = max(0, max_tokens - generated)
        for key in (signal, signal.coarse):
            longer = [min(n, max_tokens) - generated for n in self._lengths.get(key, ()) if n > generated]
            if len(longer) >= self.min_answers:
                return float(min(room, sum(longer) / len(longer)))
        return float(room)

    def known(self, signal: LengthSignal) -> int:
        """Answers recorded under the signal's fine key (for reports and tests)."""
        return len(self._lengths.get(signal, ()))
