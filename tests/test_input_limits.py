"""Input caps refuse oversized inputs before any work, naming the field and the limit."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support.fakes import fake_pb_module
from tokenrouter_backend.core.protocol import input_limits
from tokenrouter_backend.core.protocol.input_limits import DEFAULT_MAX_INPUT_BYTES, MIB, text_input
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.core.text.stop_text import parse_stop_words


def test_text_input_is_measured_in_bytes_before_decoding():
    assert text_input([b"abc"], 3) == "abc"
    assert text_input(["é"], 2) == "é"
    with pytest.raises(InvalidRequest, match=r"text_input is 4 bytes; at most max_input_bytes = 3 allowed"):
        text_input([b"abcd"], 3)
    with pytest.raises(InvalidRequest, match=r"text_input is 4 bytes"):
        text_input(["éé"], 3)  # 2 characters, 4 bytes
    with pytest.raises(InvalidRequest, match="exactly one string; got 2"):
        text_input([b"a", b"b"], 10)
    with pytest.raises(InvalidRequest, match="exactly one string; got 0"):
        text_input([], 10)
    assert text_input([b"\xff"], 10) == "\ufffd"  # invalid UTF-8 is replaced, as before


def test_max_input_bytes_config_range():
    assert DEFAULT_MAX_INPUT_BYTES == MIB
    assert input_limits.max_input_bytes_from_config(5) == 5
    for bad in (0, -1, 64 * MIB + 1):
        with pytest.raises(InvalidRequest, match=r"max_input_bytes must be in \[1, 67108864\]"):
            input_limits.max_input_bytes_from_config(bad)


class CountingList(list):
    """A list whose elements report every look."""

    def __init__(self, items):
        super().__init__(items)
        self.looked = 0

    def __iter__(self):
        for item in super().__iter__():
            self.looked += 1
            yield item


def test_stop_words_count_is_checked_before_any_element():
    words = CountingList([b"\xff"] * 10_000)  # invalid elements: a per-element check would name one
    with pytest.raises(InvalidRequest, match="stop_words has 10000 entries; at most 16 allowed"):
        parse_stop_words(words)
    assert words.looked == 0
    with pytest.raises(InvalidRequest, match=r"stop_words\[0\] is 1025 bytes; at most 256 characters"):
        parse_stop_words([b"\xff" * 1025])  # refused by length, never decoded
    assert parse_stop_words(["é" * 256]) == ("é" * 256,)


def test_stop_ids_count_cap():
    input_limits.check_count("STOP_IDS", input_limits.MAX_STOP_IDS, input_limits.MAX_STOP_IDS)
    with pytest.raises(InvalidRequest, match="STOP_IDS has 1025 entries; at most 1024 allowed"):
        input_limits.check_count("STOP_IDS", 1025, input_limits.MAX_STOP_IDS)


def _fake_pb():
    return fake_pb_module("pb_utils")


class SpyTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def encode(self, text):
        self.calls += 1
        return self.tokenizer.encode(text)

    def get_vocab_size(self, with_added_tokens=True):
        return self.tokenizer.get_vocab_size(with_added_tokens=with_added_tokens)


@pytest.fixture
def preprocessing(tiny_repository, monkeypatch):
    from tokenrouter_backend.serving import text_models

    config = {"parameters": {"max_input_bytes": {"string_value": "64"},
                             "end_id": {"string_value": "-1"}}}
    args = {"model_config": json.dumps(config), "model_version": "1",
            "model_repository": str(tiny_repository / "preprocessing")}
    model = text_models.PreprocessingModel(_fake_pb(), args)
    model.tokenizer = SpyTokenizer(model.tokenizer)
    return model


def test_preprocessing_refuses_oversized_text_without_tokenizing(preprocessing):
    assert preprocessing.max_input_bytes == 64
    too_long = {"text_input": np.array([[b"x" * 65]], dtype=np.object_)}
    response = preprocessing.execute([too_long])[0]
    assert response.error.message() == "text_input is 65 bytes; at most max_input_bytes = 64 allowed"
    assert preprocessing.tokenizer.calls == 0
    two = {"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_)}
    assert "exactly one string; got 2" in preprocessing.execute([two])[0].error.message()
    ok = preprocessing.execute([{"text_input": np.array([[b"x" * 64]], dtype=np.object_)}])[0]
    assert ok.error is None and ok.tensors["INPUT_ID"].size > 0
    assert preprocessing.tokenizer.calls == 1
