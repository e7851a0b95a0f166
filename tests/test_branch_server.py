"""Branch models heavy/light in a real tritonserver (tiny random Qwen2 ONNX) over HTTP.

Checks: results equal the in-process engine, concurrent requests are batched into one
execute() (batch_size > 1), errors come back per request, metrics are exported.
"""
import concurrent.futures as cf
import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tokenrouter_backend.core.protocol.branch_auth import key_parameters, write_key_files
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, op_to_arrays, result_from_arrays
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig
from tokenrouter_backend.server import process as launcher

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

TEMPLATE = Path(__file__).resolve().parents[1] / "model_repository"


def make_repository(root: Path, onnx_dir: Path) -> Path:
    """Template configs for heavy and light, placeholders filled, tiny model in 1/."""
    for name in ("heavy", "light"):
        dst = root / name
        shutil.copytree(TEMPLATE / name, dst, ignore=shutil.ignore_patterns("__pycache__"))
        cfg = (dst / "config.pbtxt").read_text()
        cfg = cfg.replace(f"${{{name}_device}}", "cpu").replace(f"${{{name}_threads}}", "1")
        cfg = cfg.replace(f"${{{name}_runtime}}", "onnx").replace(f"${{{name}_kv_budget_mb}}", "256")
        assert "${" not in cfg
        (dst / "config.pbtxt").write_text(cfg)
        for f in ("model.onnx", "model.json"):
            shutil.copy(onnx_dir / f, dst / "1" / f)
    return root


@pytest.fixture(scope="module")
def key(server):
    return (server.repository / "heavy" / "branch.key").read_text().strip()


@pytest.fixture(scope="module")
def server(tiny_qwen_dir, tmp_path_factory):
    repo = make_repository(tmp_path_factory.mktemp("repo"), tiny_qwen_dir)
    write_key_files(repo)
    log = tmp_path_factory.mktemp("log") / "tritonserver.log"
    with launcher.TritonServer(repo, log_path=log, ready_timeout_s=120) as srv:
        yield srv


def infer(url: str, model: str, op: BranchOp, key: str):
    """One branch step over HTTP; returns (BranchResult | None, error text | None)."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    inputs = []
    for name, arr in op_to_arrays(op).items():
        t = httpclient.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == bool else
                                  {np.dtype(np.uint64): "UINT64", np.dtype(np.int32): "INT32",
                                   np.dtype(np.float32): "FP32"}[arr.dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    try:
        res = client.infer(model, inputs, parameters=key_parameters(key))
    except Exception as exc:  # noqa: BLE001 - tritonclient raises InferenceServerException
        return None, str(exc)
    return result_from_arrays(res.as_numpy), None


def reference(onnx_dir, ops):
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM

    eng = BranchEngine(OnnxCausalLM(onnx_dir, intra_op_threads=1), config=EngineConfig(), name="ref")
    return [eng.run([op])[0] for op in ops]


def test_steps_match_engine_and_errors_name_branch(server, key, tiny_qwen_dir):
    ops = [BranchOp(11, 0, (3, 4, 5, 6), draft_len=4), BranchOp(11, 6, (9,), draft_len=3),
           BranchOp(11, 2, (7, 8))]
    ref = reference(tiny_qwen_dir, ops)
    for op, want in zip(ops, ref):
        got, err = infer(server.http_url, "heavy", op, key)
        assert err is None, err
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.token_probs, want.token_probs, atol=1e-5)
        np.testing.assert_allclose(got.input_probs, want.input_probs, atol=1e-5)
        assert got.session_len == want.session_len
    _, err = infer(server.http_url, "light", BranchOp(99, 4, (1,)), key)
    assert "light: session 99 does not exist" in err
    _, err = infer(server.http_url, "heavy", BranchOp(11, 50, (1,)), key)
    assert "heavy: keep_len 50" in err and "4 tokens" in err
    got, err = infer(server.http_url, "heavy", BranchOp(11, 0, (), release=True), key)
    assert err is None and got.session_len == 0


def test_concurrent_steps_are_batched(server, key, tiny_qwen_dir):
    ops = [BranchOp(100 + i, 0, tuple(range(5, 5 + 3 + i)), draft_len=1 + i % 4) for i in range(16)]
    ref = reference(tiny_qwen_dir, ops)
    with cf.ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda op: infer(server.http_url, "light", op, key), ops))
    for (got, err), want in zip(outs, ref):
        assert err is None, err
        np.testing.assert_array_equal(got.tokens, want.tokens)
        assert got.session_len == want.session_len
    assert max(got.batch_size for got, _ in outs) > 1
    metrics = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    sessions = re.search(r'tokenrouter_kv_sessions\{branch="light"\} (\S+)', metrics)
    assert sessions and float(sessions.group(1)) >= 16
    assert re.search(r'tokenrouter_kv_bytes\{branch="light"\} [1-9]', metrics)
    assert 'tokenrouter_branch_batch_size_bucket{branch="light",le="2"}' in metrics
    assert "tokenrouter_branch_forward_ms" in metrics
    for op in ops:
        assert infer(server.http_url, "light", BranchOp(op.session_id, 0, (), release=True), key)[1] is None
    metrics = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    assert re.search(r'tokenrouter_kv_sessions\{branch="light"\} 0\b', metrics)
    assert re.search(r'tokenrouter_kv_bytes\{branch="light"\} 0\b', metrics)
