"""The router's request glue without a server: one table of input names (the config's),
one read per request into ``RouterInputs``, the core request and admission's view built from
it, and the BLS branch over a plain ``exec_bls`` coroutine function."""
from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from support.fakes import fake_pb_module
from tokenrouter_backend.branches.bls import BlsAnswer, BlsBranch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, KVBudgetFull, SessionMissing, encode_error
from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.serving.backend import bls_exec
from tokenrouter_backend.serving.request import parse_request, request_info
from tokenrouter_backend.serving.router_inputs import INPUT_NAMES, PARAM_INPUTS, RouterInputs, read_router_request

ROUTER_CONFIG = Path(__file__).resolve().parents[1] / "model_repository" / "router" / "config.pbtxt"


class FakeRequest(dict):
    """A router request: input arrays by name, and its id."""

    def __init__(self, arrays, request_id=""):
        super().__init__(arrays)
        self._id = request_id

    def request_id(self):
        return self._id


def test_the_table_names_every_input_of_the_router_config():
    text = ROUTER_CONFIG.read_text()
    inputs = text[text.index("input ["):text.index("output [")]
    assert INPUT_NAMES == set(re.findall(r'name: "(\w+)"', inputs))


def test_a_request_is_read_once_into_plain_python():
    pb = fake_pb_module("pb_utils")
    request = FakeRequest({
        "INPUT_ID": np.array([[5, 6, 7]], dtype=np.int32),
        "STOP_IDS": np.array([[9, -1, 3, 4]], dtype=np.int32),
        "END_ID": np.array([[2]], dtype=np.int32),
        "stop_words": np.array([[b"ab", b"c"]], dtype=np.object_),
        "max_tokens": np.array([[12]], dtype=np.int32),
        "router_mode": np.array([[b"route"]], dtype=np.object_),
        "temperature": np.array([[0.5]], dtype=np.float32),
        "stream": np.array([[True]], dtype=bool),
        "top_k": np.zeros((1, 0), dtype=np.int32),  # an empty tensor counts as absent
        "decision_log": np.array([[False]], dtype=bool),
        "dynamic_threshold_quantile": np.array([[0.25]], dtype=np.float32),
        "learned_router": np.array([[False]], dtype=bool),
        "show_routing": np.array([[True]], dtype=bool),
    }, request_id="r-1")
    inputs = read_router_request(pb, request)
    assert inputs.request_id == "r-1" and inputs.prompt == (5, 6, 7)
    assert inputs.stop_ids == (9, -1, 3, 4) and inputs.stop_words == (b"ab", b"c") and inputs.end_id == 2
    assert dict(inputs.params) == {"max_tokens": 12, "router_mode": "route", "temperature": 0.5, "stream": True}
    assert all(type(v) in (int, float, bool, str) for v in inputs.params.values())
    assert (inputs.decision_log, inputs.dynamic_quantile, inputs.learned_router, inputs.show_routing) == \
        (False, 0.25, False, True)
    assert set(inputs.params) <= set(PARAM_INPUTS)
    assert read_router_request(pb, FakeRequest({})) == RouterInputs()
    assert read_router_request(pb, {}).request_id == ""  # a request without request_id()


def test_the_core_request_and_the_admission_view_come_from_that_value():
    inputs = RouterInputs(request_id="r", prompt=(5, 6, 7), params={"max_tokens": 4, "router_mode": "route"},
                          stop_ids=(9, -1), end_id=2, decision_log=True, dynamic_quantile=0.5)
    req = parse_request(inputs, RouterDefaults())
    assert req.prompt == (5, 6, 7) and req.params.max_tokens == 4 and req.params.mode == Mode.ROUTE
    assert req.end_id == 2 and req.stop_text is None and req.stop_sequences
    assert parse_request(RouterInputs(prompt=(1,), end_id=-1), RouterDefaults()).end_id is None
    info = request_info(inputs)
    assert (info.request_id, info.prompt, info.explicit_mode, info.decision_log, info.dynamic_quantile) == \
        ("r", (5, 6, 7), True, True, 0.5)
    plain = request_info(RouterInputs(prompt=(1,), params={"router_mode": ""}))
    assert not plain.explicit_mode and plain.decision_log is None and plain.dynamic_quantile is None


@pytest.mark.parametrize("inputs, message", [
    (RouterInputs(), "text_input must not be empty"),
    (RouterInputs(prompt=(1,) * 17), "text_input is 17 tokens; max_input_tokens allows at most 16"),
    (RouterInputs(prompt=(1,) * 10, params={"max_tokens": 30}),
     "text_input is 10 tokens and max_tokens is 30: together they must fit the context of 32 tokens"),
    (RouterInputs(prompt=(1,), stop_ids=(1,) * 1025), "STOP_IDS has 1025 entries; at most 1024 allowed"),
    (RouterInputs(prompt=(1,), stop_words=(b"x",)),
     "stop_words needs the router's tokenizer (router/1/tokenizer); this repository has none"),
    (RouterInputs(prompt=(1,), params={"max_tokens": 0}),
     "max_tokens must be in [1, 4096]; 0 only with return_prompt_log_probs (score the prompt, answer nothing)"),
    (RouterInputs(prompt=(1,), params={"router_mode": "fast"}),
     "router_mode must be one of heavy, light, verify, route; got 'fast'"),
    (RouterInputs(prompt=(1,), params={"temperature": 1e-38}),
     "temperature must be 0 (greedy) or in [0.01, 100.0]; got 1e-38"),
    (RouterInputs(prompt=(1,), params={"temperature": 101.0}), "temperature must be in [0.0, 100.0]; got 101.0"),
])
def test_request_errors_name_the_field(inputs, message):
    defaults = RouterDefaults(max_tokens=8, max_input_tokens=16, max_context=32, light_kv_window=0)
    with pytest.raises(InvalidRequest) as caught:
        parse_request(inputs, defaults)
    assert str(caught.value) == message


class FakeBls:
    """pb_utils' BLS surface: InferenceRequest(...).exec() answering from ``answer`` (and the thread
    it ran on: ``bls_exec`` runs each called model's calls on that model's own threads)."""

    def __init__(self, answer):
        self.pb = fake_pb_module("pb_utils")
        self.sent = []
        self.threads = []
        outer = self

        class Response:
            def __init__(self, outputs, error):
                self.outputs, self.err = outputs, error

            def has_error(self):
                return self.err is not None

            def error(self):
                return self.pb.TritonError(self.err)

        Response.pb = self.pb

        class InferenceRequest:
            def __init__(self, **kwargs):
                outer.sent.append(kwargs)

            def exec(self):
                outer.threads.append(threading.current_thread().name)
                outputs, error = answer
                return Response(outputs, error)

        self.pb.InferenceRequest = InferenceRequest
        self.pb.get_output_tensor_by_name = lambda response, name: (
            self.pb.Tensor(name, response.outputs[name]) if name in response.outputs else None)


def test_bls_exec_builds_the_request_and_reads_the_answer():
    from tokenrouter_backend.core.protocol.branch_protocol import BranchResult, result_to_arrays

    result = BranchResult(tokens=np.array([4, 5]), token_probs=np.array([0.5, 0.25]), entropy=np.zeros(2),
                          input_probs=np.zeros(2), session_len=3)
    fake = FakeBls((result_to_arrays(result), None))
    branch = BlsBranch("light", "light_model", bls_exec(fake.pb), timeout_ms=250, parameters={"key": "k"})
    got = asyncio.run(branch.step(BranchOp(1, 0, (1, 2, 3))))
    assert got.tokens.tolist() == [4, 5] and got.session_len == 3
    (sent,) = fake.sent
    assert sent["model_name"] == "light_model" and sent["requested_output_names"] == []
    assert sent["timeout"] == 250_000 and sent["parameters"] == {"key": "k"}
    assert "session_id" in {t.name for t in sent["inputs"]}
    untimed = FakeBls((result_to_arrays(result), None))
    asyncio.run(BlsBranch("light", "light", bls_exec(untimed.pb)).step(BranchOp(1, 0, (1,))))
    assert "timeout" not in untimed.sent[0] and "parameters" not in untimed.sent[0]
    assert fake.threads[0].startswith("bls-light_model") and untimed.threads[0].startswith("bls-light")


@pytest.mark.parametrize("message, error", [
    (encode_error(SessionMissing("session 1 does not exist")), SessionMissing),
    (encode_error(KVBudgetFull("no room")), KVBudgetFull),
])
def test_a_bls_error_comes_back_as_the_branch_error(message, error):
    async def exec_bls(model, inputs, parameters, timeout_ms):
        return BlsAnswer(error=message)

    with pytest.raises(error, match=r"heavy branch \(heavy\): "):
        asyncio.run(BlsBranch("heavy", "heavy", exec_bls).step(BranchOp(1, 0, (1,))))
    fake = FakeBls(({}, message))
    with pytest.raises(error):
        asyncio.run(BlsBranch("heavy", "heavy", bls_exec(fake.pb)).step(BranchOp(1, 0, (1,))))


class Untouchable(np.ndarray):
    """An input whose elements must not be read (only its size)."""

    def tolist(self):
        raise AssertionError("an element was read before the size check")

    def __iter__(self):
        raise AssertionError("an element was read before the size check")


def untouchable(n, dtype=np.int32):
    return np.zeros((1, n), dtype=dtype).view(Untouchable)


@pytest.mark.parametrize("arrays, message", [
    ({"INPUT_ID": untouchable(17)}, "text_input is 17 tokens; max_input_tokens allows at most 16"),
    ({"INPUT_ID": untouchable(2), "STOP_IDS": untouchable(1025)}, "STOP_IDS has 1025 entries; at most 1024 allowed"),
    ({"INPUT_ID": untouchable(2), "stop_words": untouchable(17, np.object_)},
     "stop_words has 17 entries; at most 16 allowed"),
    ({"INPUT_ID": untouchable(2), "temperature": np.zeros((1, 2), np.float32)},
     "temperature must hold one value; got 2"),
    ({"INPUT_ID": untouchable(2), "END_ID": np.zeros((1, 3), np.int32)}, "END_ID must hold one value; got 3"),
])
def test_every_input_is_sized_before_its_elements_are_read(arrays, message):
    with pytest.raises(InvalidRequest) as caught:
        read_router_request(fake_pb_module("pb_utils"), FakeRequest(arrays), max_input_tokens=16)
    assert str(caught.value) == message
