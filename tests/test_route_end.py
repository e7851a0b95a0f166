"""Route answers end on heavy-vouched tokens: the end of an answer is checked both ways.

Scripted models count up (t -> t + 1) with confidence; where a script says so, a model
ends (END). The light model ending too early must be rolled back by a strong heavy
rejection; the light model going on past the heavy model's end must end there even where
the heavy model gives the light token a probability above the rollback threshold.
"""
from __future__ import annotations

import asyncio

import numpy as np

from support.fakes import VOCAB, FakeBranch
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.text.stop_text import StopText

END = VOCAB - 1
COUNT = VOCAB - 1  # tokens 0..COUNT-1 are counted; END is never counted
PROMPT = (1, 2, 3)


class ScriptLM:
    """Next token is last + 1 (logit 10); after ``end_after`` generated tokens it ends.

    ``end_logits``: (END logit, counting logit) at the end position. A confident end is
    (10, 0); a heavy end that leaves the counting token ~0.23 probability is (5, 4).
    """

    def __init__(self, end_after: int | None = None, end_logits=(10.0, 0.0), wrong_at: int | None = None):
        self.end_after, self.end_logits, self.wrong_at = end_after, end_logits, wrong_at

    def logits(self, prefix) -> np.ndarray:
        z = np.zeros(VOCAB, np.float32)
        nxt = (int(prefix[-1]) + 1) % COUNT
        at = len(prefix) - len(PROMPT)  # generated tokens so far
        if self.wrong_at is not None and at == self.wrong_at:
            nxt = (nxt + 5) % COUNT  # a confident mistake
        if self.end_after is not None and at == self.end_after:
            z[END], z[nxt] = self.end_logits
        else:
            z[nxt] = 10.0
        return z


def run(light_lm, heavy_lm, mode="route", stop_text=None, **given):
    light, heavy = FakeBranch("light", light_lm), FakeBranch("heavy", heavy_lm)
    defaults = RouterDefaults(heavy_first=given.pop("heavy_first", True))
    params = defaults.request_params({"router_mode": mode, "max_tokens": 20, "block_size": 4, **given})
    out = []
    extra = {"stop_text": stop_text} if stop_text else {}
    request = GenerationRequest(PROMPT, params, end_id=END, **extra)
    stats = asyncio.run(generate(request, light, heavy, lambda t, s, f: out.extend(t), session_id=9))
    assert not light.sessions and not heavy.sessions
    return out, stats, heavy


def test_light_ending_too_early_is_rolled_back():
    heavy_lm = ScriptLM(end_after=10)
    ref, ref_stats, _ = run(heavy_lm, heavy_lm, mode="heavy")
    assert len(ref) == 10 and ref_stats.finish_reason == "end_id"
    out, stats, heavy = run(ScriptLM(end_after=3), heavy_lm)
    assert out == ref and stats.finish_reason == "end_id"
    assert stats.rollbacks >= 1 and heavy.calls >= 1


def test_light_going_past_the_heavy_end_ends_there_whatever_the_threshold():
    heavy_lm = ScriptLM(end_after=6, end_logits=(5.0, 4.0))  # heavy gives continuing ~0.23
    ref, ref_stats, _ = run(heavy_lm, heavy_lm, mode="heavy")
    assert len(ref) == 6 and ref_stats.finish_reason == "end_id"
    for rollback_threshold in (0.05, 0.0):
        out, stats, _ = run(ScriptLM(), heavy_lm, rollback_threshold=rollback_threshold, heavy_first=False)
        assert out == ref and stats.finish_reason == "end_id", rollback_threshold
        assert stats.light_tokens == 6 and stats.heavy_tokens == 0


def test_unchecked_tail_is_checked_before_max_tokens():
    # the light model's confident mistake lies within the last rollback_window tokens
    heavy_lm = ScriptLM()
    ref, _, _ = run(heavy_lm, heavy_lm, mode="heavy")
    out, stats, heavy = run(ScriptLM(wrong_at=17), heavy_lm, rollback_window=32)
    assert out == ref and stats.finish_reason == "length" and stats.rollbacks == 1


def test_light_stop_string_the_heavy_model_rejects_is_rolled_back():
    heavy_lm = ScriptLM()
    ref, _, _ = run(heavy_lm, heavy_lm, mode="heavy")
    light_lm = ScriptLM(wrong_at=4)  # light confidently writes 13 instead of 8 after 7
    light_out, _, _ = run(light_lm, light_lm, mode="light")
    assert light_out[3:5] == [7, 13]
    decode = lambda ids: "".join(f"<{i}>" for i in ids)  # noqa: E731
    stop = StopText(["7><13"], decode)  # starts and ends inside a token, spans two
    out, stats, _ = run(light_lm, heavy_lm, stop_text=stop)
    assert out == ref and stats.finish_reason == "length" and stats.rollbacks >= 1
    # the same stop string in the heavy model's own text ends the answer before it
    stop = StopText(["7><8"], decode)
    out, stats, _ = run(light_lm, heavy_lm, stop_text=stop)
    assert decode(out)[: len(decode(out)) - stats.stop_trim_chars] == "<4><5><6><"
    assert stats.finish_reason == "stop_words"
