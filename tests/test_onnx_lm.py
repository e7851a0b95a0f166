"""OnnxCausalLM on the exported tiny heavy model: the KV contract and padded batching."""
from __future__ import annotations

import numpy as np
import pytest

from tokenrouter_backend.engine.onnx_lm import ModelInfo, OnnxCausalLM
from tokenrouter_backend.export.validate import batch_step

TOL = 1e-4


@pytest.fixture(scope="module")
def lm(tiny_export):
    out, _ = tiny_export
    return OnnxCausalLM(out / "heavy" / "1")


def _single(lm, ids):
    (logits, kv), = batch_step(lm, [lm.empty_past(1)], [ids], [0])
    return logits, kv


def test_new_kv_holds_only_new_tokens(lm):
    info = lm.info
    logits, kv = _single(lm, [3, 4, 5])
    assert logits.shape == (3, info.vocab_size) and logits.dtype == np.float32
    (step_logits, new), = batch_step(lm, [kv], [[6, 7]], [3])
    assert step_logits.shape == (2, info.vocab_size)
    assert len(new) == info.num_layers
    assert new[0][0].shape == (1, info.num_kv_heads, 2, info.head_dim)
    assert info.kv_bytes_per_token() == 2 * info.num_layers * info.num_kv_heads * info.head_dim * 4


def test_kv_cache_decode_equals_full_forward(lm):
    ids = [10, 20, 30, 40, 50, 60]
    full, _ = _single(lm, ids)
    _, kv = _single(lm, ids[:3])
    for t in range(3, len(ids)):
        (step, new), = batch_step(lm, [kv], [[ids[t]]], [t])
        np.testing.assert_allclose(step[0], full[t], atol=TOL)
        kv = [(np.concatenate([k, nk], 2), np.concatenate([v, nv], 2)) for (k, v), (nk, nv) in zip(kv, new)]


def test_left_padded_batch_equals_single_sequences(lm):
    a, b = [11, 12, 13, 14, 15, 16, 17], [21, 22, 23]
    full_a, _ = _single(lm, a)
    full_b, _ = _single(lm, b)
    _, kv_a = _single(lm, a[:5])  # past 5 and 2: row b's past is left-padded by 3
    _, kv_b = _single(lm, b[:2])
    rows = batch_step(lm, [kv_a, kv_b], [a[5:], b[2:]], [5, 2])  # 2 vs 1 new: b right-padded
    np.testing.assert_allclose(rows[0][0], full_a[5:], atol=TOL)
    np.testing.assert_allclose(rows[1][0], full_b[2:], atol=TOL)


def test_unmasked_left_padding_is_detected(lm):
    """The comparison can fail: attending to the zero-padded past changes row b's logits."""
    b = [21, 22, 23]
    full_b, _ = _single(lm, b)
    _, kv_b = _single(lm, b[:2])
    pad = [(np.pad(k, [(0, 0), (0, 0), (3, 0), (0, 0)]), np.pad(v, [(0, 0), (0, 0), (3, 0), (0, 0)]))
           for k, v in kv_b]
    mask = np.ones((1, 6), dtype=np.int64)  # wrong: the 3 padded slots are marked real
    logits, _ = lm.forward(np.array([[23]]), mask, np.array([[2]]), pad)
    assert np.abs(logits[0, 0] - full_b[2]).max() > 100 * TOL


def test_model_json_round_trip(tmp_path):
    info = ModelInfo(num_layers=2, num_kv_heads=2, head_dim=16, vocab_size=768, precision="int8-dynamic")
    info.save(tmp_path / "model.json")
    assert ModelInfo.load(tmp_path / "model.json") == info


def test_consolidated_external_data_runs_the_same(lm, tiny_export, tmp_path):
    """Weights scattered over many files (as the exporter writes > 2 GB) -> one .data file."""
    import shutil

    import onnx

    from tokenrouter_backend.export.onnx_export import consolidate_external_data

    out, _ = tiny_export
    scattered = tmp_path / "scattered"
    scattered.mkdir()
    model = onnx.load(str(out / "heavy" / "1" / "model.onnx"))
    onnx.save_model(model, str(scattered / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0)
    assert len(list(scattered.iterdir())) > 10
    final = tmp_path / "final"
    final.mkdir()
    consolidate_external_data(scattered / "model.onnx", final / "model.onnx")
    shutil.copy(out / "heavy" / "1" / "model.json", final / "model.json")
    assert sorted(p.name for p in final.iterdir()) == ["model.json", "model.onnx", "model.onnx.data"]
    expected, _ = _single(lm, [1, 2, 3])
    got, _ = _single(OnnxCausalLM(final), [1, 2, 3])
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_threading_knobs_reach_the_session_and_leave_outputs_alone(lm, tiny_export):
    from tokenrouter_backend.engine.onnx_lm import OrtThreading

    out, _ = tiny_export
    shy = OnnxCausalLM(out / "heavy" / "1", intra_op_threads=2,
                       threading=OrtThreading(spinning=False, dynamic_block_base=4))
    opts = shy.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.get_session_config_entry("session.dynamic_block_base") == "4"
    default = lm.session.get_session_options()
    assert default.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    ids = [10, 20, 30, 40]
    np.testing.assert_allclose(_single(shy, ids)[0], _single(lm, ids)[0], atol=TOL)


def test_pad_rows_grows_short_forwards_to_min_rows():
    from tokenrouter_backend.engine.onnx_lm import pad_rows

    assert pad_rows(2, 1, None, 2) is None and pad_rows(1, 3, None, 2) is None  # enough rows already
    assert pad_rows(1, 1, None, 1) is None
    lone = pad_rows(1, 1, None, 2)  # one session, one token: the batch is repeated
    assert lone.copies == 2 and lone.batch == 1 and lone.wanted == 1 and lone.logits_positions.tolist() == [[0]]
    last = pad_rows(1, 5, np.array([[4]]), 2)  # a prefill asking its last position: the LM head gets two rows
    assert last.copies == 1 and last.wanted == 1 and last.logits_positions.tolist() == [[4, 4]]


def test_a_min_rows_model_pads_and_returns_the_callers_shapes(lm, tiny_export, tmp_path):
    """``min_rows`` 2 (the int8-compute light mode declares it): a one-session, one-token
    forward and a last-position prefill run padded, and give the unpadded call's shapes and values."""
    import dataclasses
    import shutil

    out, _ = tiny_export
    src = out / "heavy" / "1"
    dst = tmp_path / "padded"
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.json":
            (dst / f.name).hardlink_to(f)  # ONNX Runtime refuses external data outside the model's folder
    shutil.copy(src / "model.json", dst / "model.json")
    info = ModelInfo.load(dst / "model.json")
    dataclasses.replace(info, min_rows=2).save(dst / "model.json")
    padded = OnnxCausalLM(dst)
    assert padded.info.min_rows == 2 and lm.info.min_rows == 1
    ids = np.array([[10, 20, 30, 40]])
    mask, pos = np.ones((1, 4), np.int64), np.arange(4)[None]
    a, kv_a = padded.forward(ids, mask, pos, padded.empty_past(1), np.array([[3]]))
    b, kv_b = lm.forward(ids, mask, pos, lm.empty_past(1), np.array([[3]]))
    assert a.shape == b.shape == (1, 1, lm.info.vocab_size)
    np.testing.assert_allclose(a, b, atol=TOL)
    step = (np.array([[50]]), np.ones((1, 5), np.int64), np.array([[4]]))
    c, new_c = padded.forward(*step, kv_a)
    d, new_d = lm.forward(*step, kv_b)
    assert c.shape == d.shape == (1, 1, lm.info.vocab_size)
    assert new_c[0][0].shape == new_d[0][0].shape == (1, lm.info.num_kv_heads, 1, lm.info.head_dim)
    np.testing.assert_allclose(c, d, atol=TOL)


def test_pad_false_runs_a_min_rows_model_as_given(lm, tiny_export, tmp_path):
    """``pad=False`` (the engine's lone decode steps): a ``min_rows`` 2 model runs a one-session,
    one-token forward as one row; shapes and values are the unpadded call's."""
    import dataclasses

    out, _ = tiny_export
    src, dst = out / "heavy" / "1", tmp_path / "lone"
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.json":
            (dst / f.name).hardlink_to(f)
    dataclasses.replace(ModelInfo.load(src / "model.json"), min_rows=2).save(dst / "model.json")
    lone = OnnxCausalLM(dst)
    seen = []
    run = lone._forward
    lone._forward = lambda ids, *rest: seen.append(ids.shape) or run(ids, *rest)
    ids = np.array([[10, 20, 30]])
    _, kv = lm.forward(ids, np.ones((1, 3), np.int64), np.arange(3)[None], lm.empty_past(1))
    step = (np.array([[40]]), np.ones((1, 4), np.int64), np.array([[3]]), kv, np.array([[0]]))
    a, new_a = lone.forward(*step, pad=False)
    b, new_b = lm.forward(*step)
    assert seen == [(1, 1)]  # one row: the single-row path, no copy
    assert a.shape == b.shape == (1, 1, lm.info.vocab_size) and new_a[0][0].shape == new_b[0][0].shape
    np.testing.assert_allclose(a, b, atol=TOL)
    lone.forward(*step)
    assert seen[-1] == (2, 1)  # the default pads to two copies
