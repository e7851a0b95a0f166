"""Raw log-probabilities from the branch engine (``BranchOp.logprobs``) against an uncached
log-softmax of the same model, greedy and sampled, extend and draft rows; and over tensors."""
import numpy as np
import pytest

from support.fixtures_engine import ToyLM
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchOp,
    Sampling,
    op_from_arrays,
    op_to_arrays,
    result_from_arrays,
    result_to_arrays,
)
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig


def log_softmax_rows(model, ids):
    """Reference: the raw log-softmax after every prefix of ``ids`` (no cache)."""
    x = np.asarray(ids, dtype=np.int64)[None]
    logits, _ = model.forward(x, np.ones_like(x), np.arange(x.shape[1])[None], model.empty_past(1))
    z = logits[0].astype(np.float64)
    return z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)


def run(model, ops):
    eng = BranchEngine(model, config=EngineConfig(), name="heavy")
    out = eng.run(ops)
    for r in out:
        assert not isinstance(r, Exception), r
    return out


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=10, top_p=0.9, seed=3)])
def test_token_input_and_top_logprobs_are_the_raw_log_softmax(sampling):
    model = ToyLM()
    prompt = (3, 4, 5, 9, 9)
    res = run(model, [BranchOp(1, 0, prompt, draft_len=4, score_last=3, sampling=sampling, logprobs=5)])[0]
    seq = prompt + tuple(int(t) for t in res.tokens[2:-1])  # inputs, then the drafts fed back
    ref = log_softmax_rows(model, seq)[len(prompt) - 3:]  # rows of the scored inputs, then the drafts
    rows = np.arange(len(res.tokens))
    np.testing.assert_allclose(res.token_logprobs, ref[rows, res.tokens], atol=1e-5)
    np.testing.assert_allclose(res.input_logprobs, ref[[0, 1], [prompt[3], prompt[4]]], atol=1e-5)
    assert res.top_ids.shape == res.top_logprobs.shape == (len(res.tokens), 5)
    best = np.argsort(-ref, axis=-1, kind="stable")[:, :5]
    np.testing.assert_allclose(res.top_logprobs, np.take_along_axis(ref, best, -1), atol=1e-5)
    assert np.all(np.diff(res.top_logprobs, axis=-1) <= 0)  # most likely first
    if sampling.greedy:  # the greedy choice is the top-1
        np.testing.assert_array_equal(res.top_ids[:, 0], res.tokens)


def test_logprobs_off_by_default_and_zero_means_no_top_list():
    model = ToyLM()
    off, zero = run(model, [BranchOp(1, 0, (3, 4, 5)), BranchOp(2, 0, (3, 4, 5), score_last=1, logprobs=0)])
    assert off.token_logprobs.size == 0 and off.top_ids.size == 0
    assert zero.token_logprobs.shape == (1,) and zero.top_ids.size == 0
    np.testing.assert_allclose(np.exp(zero.token_logprobs), zero.token_probs, rtol=1e-5)  # greedy: T = 1


def test_logprobs_travel_over_tensors():
    model = ToyLM()
    op = BranchOp(7, 0, (3, 4, 5), draft_len=2, score_last=2, logprobs=3)
    back = op_from_arrays(op_to_arrays(op).get)
    assert back.logprobs == 3
    assert op_from_arrays(op_to_arrays(BranchOp(7, 0, (3,))).get).logprobs == -1  # not sent: off
    res = run(model, [op])[0]
    arrays = result_to_arrays(res)
    got = result_from_arrays(lambda name: arrays.get(name))
    np.testing.assert_array_equal(got.top_ids, res.top_ids)
    np.testing.assert_allclose(got.token_logprobs, res.token_logprobs)
    np.testing.assert_allclose(got.input_logprobs, res.input_logprobs)
    with pytest.raises(ValueError, match="logprobs"):
        op_from_arrays({**op_to_arrays(op), "logprobs": np.array([[21]], np.int32)}.get)
