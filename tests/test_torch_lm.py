"""The torch runtime on CPU (tiny pair, FP32): TorchCausalLM, KV buffers as torch tensors, and
engine / block-loop results equal to the ONNX runtime's on the same steps."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tokenrouter_backend.branches.local_pair import LocalPair
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp
from tokenrouter_backend.engine.branch_engine import BranchEngine
from tokenrouter_backend.engine.kv_session import KVShape
from tokenrouter_backend.engine.kv_store import KVStore
from tokenrouter_backend.engine.onnx_lm import ModelInfo, OnnxCausalLM
from tokenrouter_backend.engine.torch_lm import TorchCausalLM, hf_folder, resolve_dtype, step_ms
from tokenrouter_backend.export.pipeline import ExportOptions, export_pair
from tokenrouter_backend.export.tiny_pair import build_tiny_pair
from tokenrouter_backend.server import paths

PROB_TOL = 1e-4  # FP32 ONNX (eager attention traced) vs FP32 torch (sdpa)
PROMPTS = [(3, 4, 5, 100, 200), (7,), tuple(range(20, 40)), (250, 251, 9, 9, 9)]


@pytest.fixture(scope="module")
def fp32_onnx_pair(tmp_path_factory) -> Path:
    """The tiny pair as FP32 ONNX (light not quantized: the torch light runs FP32 on CPU)."""
    heavy, light = build_tiny_pair(paths.tiny_dir())
    work = tmp_path_factory.mktemp("fp32_onnx")
    export_pair(heavy, light, work / "repo", ExportOptions(light_quant="none", template=None, work_dir=work))
    return work


@pytest.fixture(scope="module")
def runtimes(fp32_onnx_pair):
    """{role: (OnnxCausalLM, TorchCausalLM)} over the same tiny FP32 weights."""
    out = {}
    for role in ("heavy", "light"):
        out[role] = (OnnxCausalLM(fp32_onnx_pair / role, intra_op_threads=1),
                     TorchCausalLM(paths.tiny_dir() / role, device="cpu"))
    return out


def test_info_and_kv_live_in_torch(runtimes):
    onnx, tlm = runtimes["heavy"]
    keys = ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings")
    assert all(getattr(onnx.info, k) == getattr(tlm.info, k) for k in keys)
    assert tlm.info.kv_dtype == "float32"
    engine = BranchEngine(tlm)
    (res,) = engine.run([BranchOp(1, 0, (3, 4, 5), draft_len=2)])
    buf = engine.store._sessions[1].buf
    assert isinstance(buf, torch.Tensor) and buf.device.type == "cpu"
    assert isinstance(res.token_probs, np.ndarray) and res.session_len == 4


def _engine_pair(lm_pair):
    return BranchEngine(lm_pair[0]), BranchEngine(lm_pair[1])


@pytest.mark.parametrize("role", ["heavy", "light"])
def test_engine_steps_equal_onnx(runtimes, role):
    onnx_engine, torch_engine = _engine_pair(runtimes[role])
    steps = [
        [BranchOp(i + 1, 0, p, draft_len=4) for i, p in enumerate(PROMPTS)],  # batched prefill + drafts
        [BranchOp(1, 3, (6, 7), draft_len=4), BranchOp(2, 1, (1, 2, 3, 4, 5)),  # rollbacks, mixed lengths
         BranchOp(3, 12, (13,), draft_len=6), BranchOp(4, 2, (9,), draft_len=3, return_dist=True)],
        [BranchOp(3, 5, (8,), draft_len=2)],  # one session alone: gather hands out views
    ]
    for ops in steps:
        for op, a, b in zip(ops, onnx_engine.run(ops), torch_engine.run(ops)):
            assert not isinstance(a, Exception) and not isinstance(b, Exception), (a, b)
            np.testing.assert_array_equal(a.tokens, b.tokens, err_msg=str(op))
            np.testing.assert_allclose(a.token_probs, b.token_probs, atol=PROB_TOL)
            np.testing.assert_allclose(a.input_probs, b.input_probs, atol=PROB_TOL)
            np.testing.assert_allclose(a.entropy, b.entropy, atol=1e-3)
            assert a.session_len == b.session_len
            if op.return_dist:
                np.testing.assert_allclose(a.dist, b.dist, atol=PROB_TOL)


@pytest.mark.parametrize("mode", ["heavy", "verify", "route"])
def test_block_loop_equal_onnx(runtimes, mode):
    onnx_pair = LocalPair.of(runtimes["light"][0], runtimes["heavy"][0])
    torch_pair = LocalPair.of(runtimes["light"][1], runtimes["heavy"][1])
    heavy_ref = LocalPair.of(runtimes["light"][1], runtimes["heavy"][1])
    for i, prompt in enumerate(PROMPTS):
        a, stats_a = onnx_pair.generate(prompt, mode, session_id=i + 1, max_tokens=20)
        b, stats_b = torch_pair.generate(prompt, mode, session_id=i + 1, max_tokens=20)
        assert a == b and len(b) == 20, f"{mode} differs on {prompt}"
        assert stats_a.heavy_calls == stats_b.heavy_calls
        if mode == "verify":
            assert b == heavy_ref.generate(prompt, "heavy", session_id=i + 1, max_tokens=20)[0]


def test_store_with_torch_buffers_grows_and_gathers_left_padded():
    lm = TorchCausalLM(paths.tiny_dir() / "light", device="cpu")
    store = KVStore(KVShape.from_info(lm.info), arrays=lm.kv_arrays)
    a, b = store.open(1, 0), store.open(2, 0)
    h, d = lm.info.num_kv_heads, lm.info.head_dim
    new = [(torch.full((2, h, 70, d), float(layer)), torch.full((2, h, 70, d), -float(layer)))
           for layer in range(lm.info.num_layers)]
    store.append(a, new, 0, 70)  # past the first capacity: doubled, on torch
    store.append(b, new, 1, 3)
    assert a.capacity == 128 and isinstance(a.buf, torch.Tensor)
    past = store.gather([a, b])
    assert past[1][0].shape == (2, h, 70, d)
    assert torch.all(past[1][0][1, :, :67] == 0) and torch.all(past[1][0][1, :, 67:] == 1)
    (alone,) = store.gather([b])[1:2]
    assert alone[0].shape == (1, h, 3, d) and alone[0].data_ptr() == b.buf[1, 0].data_ptr()  # a view
    assert store.bytes_in_use == a.buf.nbytes + b.buf.nbytes


def test_hf_folder_and_dtype_rules(tmp_path):
    assert hf_folder(paths.tiny_dir() / "heavy") == paths.tiny_dir() / "heavy"
    with pytest.raises(FileNotFoundError, match="--runtime torch"):
        hf_folder(tmp_path)
    assert resolve_dtype("auto", "cuda") == "float16" and resolve_dtype("auto", "cpu") == "float32"
    with pytest.raises(ValueError, match="device must be one of cpu, cuda; got 'tensorrt'"):
        resolve_dtype("auto", "tensorrt")
    with pytest.raises(ValueError, match="dtype must be auto or one of"):
        resolve_dtype("int8", "cpu")


def test_step_ms_runs_both_runtimes(runtimes):
    onnx, tlm = runtimes["light"]
    for lm in (onnx, tlm):
        assert step_ms(lm, batch=2, past_len=8, repeats=2, warmup=1) > 0


def test_export_runtime_torch_writes_hf_branches(tmp_path):
    heavy, light = build_tiny_pair(paths.tiny_dir())
    template = Path(__file__).resolve().parents[1] / "model_repository"
    out = tmp_path / "repo"
    report = export_pair(heavy, light, out, ExportOptions(runtime="torch", template=template, work_dir=tmp_path / "w"))
    for role in ("heavy", "light"):
        branch = out / role / "1"
        assert (branch / "hf" / "config.json").is_file() and not (branch / "model.onnx").exists()
        assert report[role]["validation"]["passed"] and report[role]["precision"] == "fp32"
        config = (out / role / "config.pbtxt").read_text()
        assert 'key: "runtime", value: { string_value: "torch" }' in config
        lm = TorchCausalLM(branch, device="cpu")  # finds hf/ inside the version directory
        assert lm.info.num_layers == ModelInfo.load(branch / "model.json").num_layers
    again = export_pair(heavy, light, out, ExportOptions(runtime="torch", template=template, work_dir=tmp_path / "w"))
    assert again["heavy"]["skipped"] and again["light"]["skipped"]
