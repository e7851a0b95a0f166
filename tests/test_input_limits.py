"""Input caps refuse oversized inputs before any work, naming the field and the limit."""
from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import pytest

from support.fakes import fake_pb_module
from tokenrouter_backend.core.protocol import input_limits
from tokenrouter_backend.core.protocol.input_limits import DEFAULT_MAX_INPUT_BYTES, MIB, text_input
from tokenrouter_backend.core.protocol.params import InvalidRequest
from tokenrouter_backend.core.text.stop_text import parse_stop_words
from tokenrouter_backend.serving.router_inputs import read_router_request


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


def stock_pb_utils():
    """The Python backend's own ``triton_python_backend_utils`` (the tritonserver wheel's), fresh."""
    from tokenrouter_backend.server.install import TritonInstall

    path = TritonInstall.find().python_backend_dir / "triton_python_backend_utils.py"
    spec = importlib.util.spec_from_file_location("stock_triton_python_backend_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wire(values) -> tuple[np.ndarray, list[int]]:
    """A BYTES input as the stub finds it in shared memory (4-byte length, bytes; per element) and its dims."""
    array = np.asarray(values, dtype=np.object_).reshape(1, -1)
    return np.frombuffer(stock_pb_utils().serialize_byte_tensor(array), dtype=np.uint8), list(array.shape)


def as_the_stub_loads(pb, encoded: tuple[np.ndarray, list[int]]) -> np.ndarray:
    """What the Python backend's stub hands to ``execute``: ``pb.deserialize_bytes_tensor(...)
    .reshape(dims)``, looked up on the module at each request (python_backend src/pb_tensor.cc)."""
    return pb.deserialize_bytes_tensor(encoded[0]).reshape(encoded[1])


def _timed(fn):
    start = time.perf_counter()
    try:
        fn()
    except InvalidRequest as exc:
        return str(exc), time.perf_counter() - start
    return None, time.perf_counter() - start


def test_a_million_stop_words_are_refused_before_the_stub_reads_them(preprocessing):
    """The real decoding path: the text models and the router install their deserializer in the
    stub (``tensors.bound_bytes_inputs``), so the count check comes before per-element work."""
    pb = preprocessing.pb  # the model installed its deserializer here at initialize
    stock = stock_pb_utils()
    words = wire([b"w"] * 1_000_000)
    prompt = np.array([[1, 2, 3]], dtype=np.int32)

    def model_path():
        request = {"INPUT_ID": prompt, "stop_words": as_the_stub_loads(pb, words)}
        parse_stop_words(read_router_request(pb, request).stop_words)

    def stock_path():
        request = {"INPUT_ID": prompt, "stop_words": as_the_stub_loads(stock, words)}
        parse_stop_words(read_router_request(pb, request).stop_words)

    refusal, model_s = _timed(model_path)
    stock_refusal, stock_s = _timed(stock_path)
    assert refusal == stock_refusal == "stop_words has 1000000 entries; at most 16 allowed"
    assert model_s * 10 < stock_s, (model_s, stock_s)  # the stock path deserializes every entry first
    few = wire([b"ab", "é".encode(), b""])
    assert as_the_stub_loads(pb, few).tolist() == as_the_stub_loads(stock, few).tolist() == [[b"ab", "é".encode(), b""]]


def test_an_oversized_element_is_refused_without_being_copied():
    deserialize = input_limits.bounded_bytes_deserializer(max_elements=4, max_element=8)
    values = deserialize(wire([b"x" * 9])[0]).reshape([1, 1])
    assert isinstance(values.flat[0], input_limits.OversizedElement) and values.flat[0].nbytes == 9
    with pytest.raises(InvalidRequest, match="text_input is over"):
        text_input(values, 8)
    with pytest.raises(InvalidRequest, match=r"stop_words\[0\] is 9 bytes"):
        parse_stop_words(list(values.reshape(-1)))
    with pytest.raises(InvalidRequest, match=r"stop_words\[1\] is 1025 bytes; at most 256 characters"):
        parse_stop_words([b"a", b"\xff" * 1025])  # refused by length, never decoded
    assert parse_stop_words(["é" * 256]) == ("é" * 256,)


def test_stop_ids_count_cap():
    input_limits.check_count("STOP_IDS", input_limits.MAX_STOP_IDS, input_limits.MAX_STOP_IDS)
    with pytest.raises(InvalidRequest, match="STOP_IDS has 1025 entries; at most 1024 allowed"):
        input_limits.check_count("STOP_IDS", 1025, input_limits.MAX_STOP_IDS)


def _fake_pb():
    pb = fake_pb_module("pb_utils")
    pb.deserialize_bytes_tensor = stock_pb_utils().deserialize_bytes_tensor  # as in a stub, before initialize
    return pb


class SpyTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def encode(self, text, **kwargs):
        self.calls += 1
        return self.tokenizer.encode(text, **kwargs)

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


def test_preprocessing_passes_a_token_id_prompt_through_checked(preprocessing):
    vocab = preprocessing.vocab_size
    ok = preprocessing.execute([{"input_ids": np.array([[3, 0, vocab - 1]], dtype=np.int32)}])[0]
    assert ok.error is None and ok.tensors["INPUT_ID"].tolist() == [[3, 0, vocab - 1]]
    assert ok.tensors["END_ID"].tolist() == [[-1]] and preprocessing.tokenizer.calls == 0
    refusals = {
        "input_ids[1] is": {"input_ids": np.array([[3, vocab]], dtype=np.int32)},
        "input_ids[0] is -1": {"input_ids": np.array([[-1]], dtype=np.int32)},
        "input_ids has 65 entries; at most 64": {"input_ids": np.full((1, 65), -5, dtype=np.int32)},  # count first
        "input_ids must hold at least one": {"input_ids": np.zeros((1, 0), dtype=np.int32)},
        "input_ids must not come with text_input": {"input_ids": np.array([[3]], dtype=np.int32),
                                                    "text_input": np.array([[b"x"]], dtype=np.object_)},
    }
    for message, request in refusals.items():
        assert message in preprocessing.execute([request])[0].error.message(), message
    assert preprocessing.tokenizer.calls == 0


def test_preprocessing_adds_special_tokens_unless_asked_not_to(preprocessing):
    text = {"text_input": np.array([[b"def f(x):"]], dtype=np.object_)}
    with_special = preprocessing.execute([text])[0].tensors["INPUT_ID"].reshape(-1).tolist()
    without = preprocessing.execute([{**text, "add_special_tokens": np.array([[False]])}])[0]
    assert without.tensors["INPUT_ID"].reshape(-1).tolist() == \
        preprocessing.tokenizer.encode("def f(x):", add_special_tokens=False).ids
    assert len(without.tensors["INPUT_ID"].reshape(-1)) <= len(with_special)


def test_preprocessing_sizes_its_scalars_and_answers_failures_by_name(preprocessing):
    text = np.array([[b"hello"]], dtype=np.object_)
    two = preprocessing.execute([{"text_input": text, "end_id": np.array([[1, 2]], dtype=np.int32)}])[0]
    assert two.error.message() == "end_id must hold one value; got 2"
    preprocessing.tokenizer = None  # any failure inside: a named error, never a Python exception
    broken = preprocessing.execute([{"text_input": text}])[0]
    assert broken.error.message().startswith("preprocessing: internal error: AttributeError")


class SpyDetok:
    def __init__(self, detok):
        self.detok, self.calls = detok, 0

    def delta(self, *args):
        self.calls += 1
        return self.detok.delta(*args)


@pytest.fixture
def postprocessing(tiny_repository):
    from tokenrouter_backend.serving import text_models

    config = {"parameters": {"max_window_tokens": {"string_value": "8"}, "vocab_size": {"string_value": "100"}}}
    args = {"model_config": json.dumps(config), "model_version": "1",
            "model_repository": str(tiny_repository / "postprocessing")}
    model = text_models.PostprocessingModel(_fake_pb(), args)
    model.detok = SpyDetok(model.detok)
    return model


def _post(tokens, prefix=0, trim=None, stats=b"{}"):
    request = {"TOKENS": np.asarray(tokens, dtype=np.int32).reshape(1, -1),
               "PREFIX_LEN": np.array([[prefix]], dtype=np.int32), "IS_FINAL": np.array([[True]]),
               "ROUTING_STATS_IN": np.array([[stats]], dtype=np.object_)}
    if trim is not None:
        request["STOP_TRIM"] = np.array([[trim]], dtype=np.int32)
    return request


@pytest.mark.parametrize("request_, message", [
    (_post([5] * 9), "TOKENS has 9 entries; at most 8 allowed"),
    (_post([5, -1]), "TOKENS[1] is -1; token ids must be in [0, 99]"),
    (_post([100]), "TOKENS[0] is 100; token ids must be in [0, 99]"),
    (_post([5], prefix=2), "PREFIX_LEN must be in [0, 1]; got 2"),
    (_post([5], trim=-1), "STOP_TRIM must be in [0, 2147483647]; got -1"),
    ({**_post([5]), "IS_FINAL": np.array([[True, False]])}, "IS_FINAL must hold one value; got 2"),
])
def test_postprocessing_refuses_before_decoding(postprocessing, request_, message):
    assert postprocessing.execute([request_])[0].error.message() == message
    assert postprocessing.detok.calls == 0
    ok = postprocessing.execute([_post([5, 6])])[0]
    assert ok.error is None and postprocessing.detok.calls == 1
