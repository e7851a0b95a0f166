"""serving.branch_model glue with a stubbed ``triton_python_backend_utils`` (no server needed)."""
import json
import shutil
import sys
import types

import numpy as np
import pytest

from support.fakes import StubFamily, fake_pb_module
from tokenrouter_backend.core.protocol.branch_auth import KEY_ENV, KEY_PARAMETER, BranchKeyError
from tokenrouter_backend.core.protocol.branch_protocol import TENSOR_OUTPUTS, BranchOp, op_to_arrays, result_from_arrays

TEST_KEY = "k" * 24


def fake_pb_utils():
    pb = fake_pb_module()
    pb.MetricFamily = StubFamily
    pb.Logger = types.SimpleNamespace(log_info=print, log_warn=print, log_error=print)
    return pb


@pytest.fixture
def glue(monkeypatch):
    monkeypatch.setenv(KEY_ENV, TEST_KEY)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    sys.modules.pop("tokenrouter_backend.serving.branch_model", None)
    import tokenrouter_backend.serving.branch_model as tb

    yield tb
    sys.modules.pop("tokenrouter_backend.serving.branch_model", None)


def test_branch_params_defaults_and_errors(glue):
    parse = glue.BranchParams.from_config
    p = parse({"device": "cpu", "intra_op_threads": "2", "max_draft_len": "8",
               "session_ttl_s": "30", "kv_cache_budget_mb": "64"}, "light")
    assert (p.onnx_dir, p.device, p.intra_op_threads) == (".", "cpu", 2)
    assert (p.engine.max_draft_len, p.engine.session_ttl_s, p.engine.kv_cache_budget_mb) == (8, 30.0, 64.0)
    assert parse({}, "heavy") == glue.BranchParams() and parse({}, "heavy").engine == glue.EngineConfig()
    default = parse({}, "heavy")
    assert (default.intra_op_spinning, default.share_cores, default.core_wait_ms, default.core_slice_ms) == \
        (True, False, 1000.0, 500.0)
    knobs = parse({"intra_op_spinning": "false", "share_cores": "true", "core_wait_ms": "50",
                   "core_slice_ms": "0"}, "light")
    assert (knobs.intra_op_spinning, knobs.share_cores, knobs.core_wait_ms, knobs.core_slice_ms) == \
        (False, True, 50.0, 0.0)
    assert default.engine.lone_decode_steps
    assert not parse({"lone_decode_steps": "false"}, "light").engine.lone_decode_steps
    every = {"max_batch": "4", "max_forward_tokens": "64", "prefix_cache": "off", "prefix_cache_block_tokens": "16",
             "kv_sink_tokens": "0", "onnx_dir": "onnx", "hf_dir": "w"}
    engine = parse(every, "light").engine
    assert (engine.max_batch, engine.max_forward_tokens, engine.prefix_cache, engine.prefix_cache_block_tokens,
            engine.kv_sink_tokens) == (4, 64, False, 16, 0)
    bad = [({"device": "${heavy_device}"}, r"heavy: config parameter device is the unfilled placeholder"),
           ({"intra_op_threads": "two"}, r"heavy: config parameter intra_op_threads must be int; got 'two'"),
           ({"intra_op_threads": "-1"}, r"config parameter intra_op_threads must be >= 0; got '-1'"),
           ({"max_draft_len": "-1"}, r"config parameter max_draft_len must be >= 0; got '-1'"),
           ({"session_ttl_s": "0"}, r"config parameter session_ttl_s must be >= 0.001; got '0'"),
           ({"max_batch": "0"}, r"config parameter max_batch must be >= 1; got '0'"),
           ({"device": "tpu"}, r"config parameter device must be one of cpu, cuda, tensorrt; got 'tpu'"),
           ({"intra_op_spinning": "maybe"}, r"config parameter intra_op_spinning must be true or false; got 'maybe'"),
           ({"share_cores": "sometimes"}, r"config parameter share_cores must be true or false; got 'sometimes'"),
           ({"core_wait_ms": "-1"}, r"config parameter core_wait_ms must be >= 0.0; got '-1'"),
           ({"core_slice_ms": "-5"}, r"config parameter core_slice_ms must be >= 0.0; got '-5'"),
           ({"lone_decode_steps": "often"}, r"config parameter lone_decode_steps must be true or false; got 'often'"),
           ({"colour": "red"}, r"heavy: unknown config parameter 'colour' \(known: core_slice_ms, ")]
    for raw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            parse(raw, "heavy")


ALL_OUTPUTS = tuple(TENSOR_OUTPUTS.values())


def model_config(path, outputs=ALL_OUTPUTS):
    return json.dumps({"name": "light", "output": [{"name": name} for name in outputs], "parameters": {
        "onnx_dir": {"string_value": path}, "device": {"string_value": "cpu"},
        "intra_op_threads": {"string_value": "1"}, "max_draft_len": {"string_value": "4"}}})


class FakeRequest(dict):
    """A branch request: input arrays by name plus its parameters (JSON, as pb_utils gives)."""

    def __init__(self, arrays, parameters):
        super().__init__(arrays)
        self._parameters = json.dumps(parameters)

    def parameters(self):
        return self._parameters


class UnreadableRequest(FakeRequest):
    """A request whose input tensors must not be read (a keyless call is refused before)."""

    def __contains__(self, name):
        raise AssertionError(f"input {name} read before the branch key was checked")


def request(op, key=TEST_KEY):
    return FakeRequest(op_to_arrays(op), {} if key is None else {KEY_PARAMETER: key})


def test_execute_batches_and_fails_requests_alone(glue, tiny_qwen_dir, tmp_path):
    version = tmp_path / "light" / "1"
    shutil.copytree(tiny_qwen_dir, version / "onnx")
    model = glue.TritonPythonModel()
    model.initialize({"model_name": "light", "model_config": model_config("onnx"),
                      "model_repository": str(tmp_path / "light"), "model_version": "1"})
    no_session = request(BranchOp(5, 0, (1,)))  # a FakeRequest: deleting an input keeps its key
    del no_session["session_id"]
    reqs = [request(BranchOp(1, 0, (3, 4, 5), draft_len=3)), no_session,
            request(BranchOp(2, 3, (1,))), request(BranchOp(3, 0, (7,), draft_len=9)),
            request(BranchOp(4, 0, (8, 9), return_dist=True))]
    out = model.execute(reqs)
    assert len(out) == 5
    good = result_from_arrays(lambda n: out[0].tensors.get(n))
    assert out[0].error is None and len(good.tokens) == 3 + 3 - 1 and good.session_len == 5
    assert good.batch_size == 2  # session 1 and 4 shared the forward
    assert "light: branch input 'session_id' is required" in out[1].error.message()
    assert out[2].error.message().startswith("light: session 2 does not exist")
    assert "draft_len 9 outside 0..4" in out[3].error.message()
    assert out[4].tensors["dist"].shape == (1, 2, 300)
    assert out[0].tensors["dist"].shape == (1, 0, 0)
    fam = StubFamily.created
    assert fam["tokenrouter_kv_sessions"].metrics[0].value == 2
    assert fam["tokenrouter_kv_sessions"].metrics[0].labels == {"branch": "light"}
    assert fam["tokenrouter_kv_bytes"].metrics[0].value == model.engine.store.bytes_in_use > 0
    assert fam["tokenrouter_branch_batch_size"].metrics[0].observations == [2, 1, 1]
    assert fam["tokenrouter_branch_batch_size"].metrics[0].buckets == [1, 2, 4, 8, 16, 32]
    assert len(fam["tokenrouter_branch_forward_ms"].metrics[0].observations) == 3
    release = model.execute([request(BranchOp(s, 0, (), release=True)) for s in (1, 4)])
    assert all(r.error is None for r in release)
    assert fam["tokenrouter_kv_bytes"].metrics[0].value == 0
    assert np.all(fam["tokenrouter_kv_sessions"].metrics[0].value == 0)


def test_a_repository_exported_before_an_output_existed_gets_responses_without_it(glue, tiny_qwen_dir, tmp_path):
    """Triton refuses a response carrying an output config.pbtxt does not declare: a branch of
    an older repository (no ``margin``, no ``lone_steps``) leaves them out, and the router reads
    their defaults."""
    version = tmp_path / "light" / "1"
    shutil.copytree(tiny_qwen_dir, version / "onnx")
    older = [n for n in TENSOR_OUTPUTS.values() if n not in ("margin", "lone_steps")]
    model = glue.TritonPythonModel()
    model.initialize({"model_name": "light", "model_config": model_config("onnx", older),
                      "model_repository": str(tmp_path / "light"), "model_version": "1"})
    (out,) = model.execute([request(BranchOp(1, 0, (3, 4, 5), draft_len=2))])
    assert out.error is None and set(out.tensors) == set(older)
    res = result_from_arrays(out.tensors.get)
    assert res.margin.shape == (0,) and not res.lone_steps and res.session_len == 3 + 2 - 1


def test_execute_refuses_requests_without_the_branch_key(glue, tiny_qwen_dir, tmp_path):
    version = tmp_path / "light" / "1"
    shutil.copytree(tiny_qwen_dir, version / "onnx")
    model = glue.TritonPythonModel()
    model.initialize({"model_name": "light", "model_config": model_config("onnx"),
                      "model_repository": str(tmp_path / "light"), "model_version": "1"})
    op = BranchOp(1, 0, (3, 4, 5), draft_len=2)
    keyless = UnreadableRequest(op_to_arrays(op), {})
    wrong = UnreadableRequest(op_to_arrays(op), {KEY_PARAMETER: "x" * 24})
    out = model.execute([keyless, wrong, request(op)])
    assert "light: refused" in out[0].error.message()
    assert f"'{KEY_PARAMETER}' is missing" in out[0].error.message()
    assert "does not match" in out[1].error.message() and TEST_KEY not in out[1].error.message()
    assert out[2].error is None and result_from_arrays(out[2].tensors.get).session_len == 3 + 2 - 1
    assert model.engine.store.session_count == 1  # refused requests created no session


def test_initialize_without_any_branch_key_fails(glue, tiny_qwen_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    shutil.copytree(tiny_qwen_dir, tmp_path / "light" / "1" / "onnx")
    args = {"model_name": "light", "model_config": model_config("onnx"),
            "model_repository": str(tmp_path / "light"), "model_version": "1"}
    with pytest.raises(BranchKeyError, match=f"set \\${KEY_ENV}"):
        glue.TritonPythonModel().initialize(args)
    (tmp_path / "light" / "branch.key").write_text("short\n")
    with pytest.raises(BranchKeyError, match="too short"):
        glue.TritonPythonModel().initialize(args)


def test_branch_params_runtime(glue):
    parse = glue.BranchParams.from_config
    assert parse({}, "heavy").runtime == "onnx"  # documented default
    p = parse({"runtime": "torch", "device": "cuda", "dtype": "float16", "hf_dir": "w"}, "heavy")
    assert (p.runtime, p.device, p.dtype, p.hf_dir) == ("torch", "cuda", "float16", "w")
    bad = [({"runtime": "tensorflow"}, r"config parameter runtime must be one of onnx, torch; got 'tensorflow'"),
           ({"runtime": "torch", "device": "tensorrt"}, r"config parameter device must be one of cpu, cuda; "
                                                        r"got 'tensorrt'"),
           ({"dtype": "int8"}, r"config parameter dtype must be one of auto, float16, float32, bfloat16; got 'int8'")]
    for raw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            parse(raw, "heavy")


def test_execute_on_the_torch_runtime(glue, tmp_path, tiny_repository):  # builds the tiny pair
    from tokenrouter_backend.server import paths

    version = tmp_path / "heavy" / "1"
    shutil.copytree(paths.tiny_dir() / "heavy", version / "hf")
    config = json.dumps({"name": "heavy", "output": [{"name": n} for n in ALL_OUTPUTS], "parameters": {
        "runtime": {"string_value": "torch"}, "device": {"string_value": "cpu"}}})
    model = glue.TritonPythonModel()
    model.initialize({"model_name": "heavy", "model_config": config,
                      "model_repository": str(tmp_path / "heavy"), "model_version": "1"})
    assert type(model.engine.model).__name__ == "TorchCausalLM"
    out = model.execute([request(BranchOp(1, 0, (3, 4, 5), draft_len=3))])
    res = result_from_arrays(lambda n: out[0].tensors.get(n))
    assert out[0].error is None and len(res.tokens) == 5 and res.session_len == 5


def test_the_repository_templates_declare_every_branch_output():
    """A branch answers only the outputs its config declares: the templates the exporter fills
    must declare all of them, or a freshly exported repository would lose one silently."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "model_repository"
    for branch in ("heavy", "light"):
        text = (root / branch / "config.pbtxt").read_text()
        block = text[text.index("output ["):text.index("]\nparameters")]
        assert set(re.findall(r'name: "(\w+)"', block)) == set(ALL_OUTPUTS), branch
