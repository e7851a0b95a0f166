"""core/signals/answer_length.py: the expected rest of an answer from recent answers' lengths."""
from __future__ import annotations

import pytest

from tokenrouter_backend.core.signals.answer_length import AnswerLengths, LengthSignal

CHAT_END = 198  # the token a chat template ends every prompt with (the assistant turn's opening)


def chat(prompt_len: int, max_tokens: int = 256) -> LengthSignal:
    return LengthSignal.of(tuple(range(prompt_len - 1)) + (CHAT_END,), max_tokens)


def test_without_evidence_the_answer_may_run_to_its_limit():
    lengths = AnswerLengths()
    assert lengths.expected_remaining(chat(60), 0, 256) == 256
    assert lengths.expected_remaining(chat(60), 10, 256) == 246


def test_the_rest_is_the_mean_over_answers_that_outlived_this_one():
    lengths = AnswerLengths(min_answers=3)
    for n in (8, 10, 12, 30):
        lengths.observe(chat(60), n)
    assert lengths.expected_remaining(chat(60), 0, 256) == pytest.approx((8 + 10 + 12 + 30) / 4)
    assert lengths.expected_remaining(chat(60), 9, 256) == pytest.approx((1 + 3 + 21) / 3)
    # only one recent answer outlived 12 tokens: too little evidence, the limit again
    assert lengths.expected_remaining(chat(60), 12, 256) == 244
    # answers cut by a smaller max_tokens count up to it
    assert lengths.expected_remaining(chat(60), 0, 20) == pytest.approx((8 + 10 + 12 + 20) / 4)


def test_signals_keep_chat_and_completion_traffic_apart_and_fall_back_to_the_buckets():
    lengths = AnswerLengths(min_answers=2)
    for n in (6, 6):
        lengths.observe(chat(60), n)
    completion = LengthSignal.of(tuple(range(60)), 256)  # same buckets, another last token
    for n in (200, 220):
        lengths.observe(completion, n)
    assert lengths.expected_remaining(chat(60), 0, 256) == 6
    assert lengths.expected_remaining(completion, 0, 256) == 210
    # a prompt of another ending but the same buckets: the coarse key (all four answers)
    other = LengthSignal.of(tuple(range(59)) + (7,), 256)
    assert lengths.expected_remaining(other, 0, 256) == pytest.approx((6 + 6 + 200 + 220) / 4)
    # another max_tokens bucket: nothing known
    assert lengths.expected_remaining(chat(60, max_tokens=2048), 0, 2048) == 2048
    assert chat(60).coarse == chat(33).coarse != chat(65).coarse  # prompt lengths 33-64 share a bucket


def test_windows_and_keys_are_bounded():
    lengths = AnswerLengths(window=4, min_answers=1, max_keys=6)
    for n in (100, 100, 100, 100, 2, 2, 2, 2):
        lengths.observe(chat(60), n)
    assert lengths.expected_remaining(chat(60), 0, 256) == 2  # the window forgot the long ones
    for last in range(10):
        lengths.observe(LengthSignal.of((last,), 16), 3)
    assert len(lengths._lengths) <= 6
    with pytest.raises(ValueError):
        AnswerLengths(window=0)
