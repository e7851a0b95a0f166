"""kv_window: a session keeps sink + recent positions; what falls between is not computed, and
results are the model's on the sequence with its middle cut out, at the original positions."""
import numpy as np
import pytest

from support.fixtures_engine import ToyLM
from tokenrouter_backend.core.loop.sampling import softmax
from tokenrouter_backend.core.protocol.branch_protocol import BranchError, BranchOp, SessionMissing
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig

SINK, WINDOW = 4, 16
PROMPT = tuple(int(t) for t in np.random.default_rng(2).integers(1, 50, 40))


def engine(model=None, **cfg):
    return BranchEngine(model or ToyLM(max_positions=256), config=EngineConfig(kv_sink_tokens=SINK, **cfg),
                        name="light")


def ok(r):
    assert not isinstance(r, Exception), r
    return r


def cut_reference(model, ids, keep):
    """Greedy choice and prob after ``ids`` when only positions in ``keep`` are visible."""
    pos = np.asarray(keep)
    x = np.asarray(ids, dtype=np.int64)[pos][None]
    logits, _ = model.forward(x, np.ones_like(x), pos[None], model.empty_past(1))
    probs = softmax(logits[0, -1])
    return int(probs.argmax()), float(probs.max())


def test_long_prefill_feeds_sink_and_window_only():
    model = ToyLM(max_positions=256)
    eng = engine(model)
    res = ok(eng.run([BranchOp(1, 0, PROMPT, score_last=1, kv_window=WINDOW)])[0])
    cut = len(PROMPT) - WINDOW
    keep = list(range(SINK)) + list(range(cut, len(PROMPT)))
    token, prob = cut_reference(model, PROMPT, keep)
    assert int(res.tokens[0]) == token and abs(float(res.token_probs[0]) - prob) < 1e-5
    assert res.session_len == len(PROMPT)  # positions of the whole sequence
    s = eng.store.get(1)
    assert s.entries == SINK + WINDOW and s.gap == cut - SINK
    assert sum(b * n for b, n in zip(eng.last_batch_sizes, eng.last_forward_tokens)) <= SINK + WINDOW
    # the next step continues at the sequence's positions over the kept entries
    nxt = ok(eng.run([BranchOp(1, len(PROMPT), (int(res.tokens[0]),), draft_len=3, kv_window=WINDOW)])[0])
    seq = list(PROMPT) + [int(res.tokens[0])]
    token, _ = cut_reference(model, seq, keep + [len(PROMPT)])
    assert int(nxt.tokens[0]) == token


def test_window_longer_than_the_sequence_changes_nothing():
    a = ok(engine().run([BranchOp(1, 0, PROMPT, draft_len=4, score_last=1, kv_window=64)])[0])
    b = ok(engine().run([BranchOp(1, 0, PROMPT, draft_len=4, score_last=1)])[0])
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.token_probs, b.token_probs, atol=1e-6)


def test_chunked_steps_stay_bounded_and_rollback_into_the_gap_is_refused():
    eng = engine()
    rng = np.random.default_rng(4)
    keep, longest = 0, 0
    for _ in range(12):  # 12 steps of 8 tokens: 96 positions
        ids = tuple(int(t) for t in rng.integers(1, 50, 8))
        res = ok(eng.run([BranchOp(1, keep, ids, score_last=1, kv_window=WINDOW)])[0])
        keep = res.session_len
        longest = max(longest, eng.store.get(1).entries)
    s = eng.store.get(1)
    assert keep == 96 and s.sink == SINK and s.gap > 0
    assert longest <= SINK + WINDOW + WINDOW // 4 + 8
    res = eng.run([BranchOp(1, SINK + 1, (3,), kv_window=WINDOW)])[0]
    assert isinstance(res, SessionMissing) and "kv_window" in str(res)
    ok(eng.run([BranchOp(1, 0, PROMPT[:6], score_last=1, kv_window=WINDOW)])[0])  # starting again works


def test_kv_window_is_validated():
    res = engine().run([BranchOp(1, 0, PROMPT, kv_window=-1)])[0]
    assert isinstance(res, BranchError) and "kv_window -1 must be >= 0" in str(res)
    big = ok(engine().run([BranchOp(1, 0, PROMPT, score_last=1, kv_window=4096)])[0])  # beyond the model: no window
    full = ok(engine().run([BranchOp(1, 0, PROMPT, score_last=1)])[0])
    assert int(big.tokens[0]) == int(full.tokens[0])


@pytest.mark.parametrize("window", [8, 16])
def test_windowed_sessions_batch_with_full_ones(window):
    model = ToyLM(max_positions=256)
    eng = engine(model)
    ops = [BranchOp(1, 0, PROMPT, score_last=1, kv_window=window), BranchOp(2, 0, PROMPT[:10], score_last=1)]
    a, b = [ok(r) for r in eng.run(ops)]
    solo = ok(engine(model).run([BranchOp(2, 0, PROMPT[:10], score_last=1)])[0])
    assert int(b.tokens[0]) == int(solo.tokens[0])
    cut = len(PROMPT) - window
    token, _ = cut_reference(model, PROMPT, list(range(SINK)) + list(range(cut, len(PROMPT))))
    assert int(a.tokens[0]) == token


def test_router_sends_a_windowed_light_prefill_whole_and_defaults_apply_to_verify_only():
    import asyncio

    from support.fakes import make_pair
    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
    from tokenrouter_backend.core.protocol.params import RouterDefaults

    d = RouterDefaults(prefill_chunk_tokens=8, light_kv_window=16)
    assert d.request_params({"router_mode": "route"}).light_kv_window == 0
    assert d.request_params({"router_mode": "route", "light_kv_window": 32}).light_kv_window == 32
    params = d.request_params({"router_mode": "verify", "max_tokens": 8})
    assert params.light_kv_window == 16
    light, heavy = make_pair()
    prompt = tuple(i % 39 + 1 for i in range(40))  # the fake vocabulary is 40
    asyncio.run(generate(GenerationRequest(prompt, params), light, heavy, lambda *a: None))
    light_ops = [op for op in light.ops if not op.release]
    # the part before the window in one call with a window of 1 (the branch feeds its sink
    # only), then the last 16 positions in chunks of 8 like any input
    first = light_ops[0]
    assert first.kv_window == 1 and first.keep_len == 0 and len(first.input_ids) >= len(prompt) - 16
    assert all(op.kv_window == 16 for op in light_ops[1:])
    assert max(len(op.input_ids) for op in light_ops[1:]) <= 16
    assert all(op.kv_window == 0 for op in heavy.ops)
    assert [len(op.input_ids) for op in heavy.ops[:4]] == [8] * 4  # heavy chunked


def test_windowed_sessions_share_blocks_until_they_drop_positions():
    model = ToyLM(max_positions=256)
    eng = engine(model, prefix_cache_block_tokens=4)
    ok(eng.run([BranchOp(1, 0, PROMPT, score_last=1)])[0])
    ok(eng.run([BranchOp(1, len(PROMPT), (3,), score_last=1)])[0])  # promotes the prompt's blocks
    short = ok(eng.run([BranchOp(2, 0, PROMPT[:12], score_last=1, kv_window=WINDOW)])[0])
    assert short.reused_tokens == 11 and eng.store.get(2).blocks  # nothing dropped yet: shared
    token, _ = cut_reference(model, PROMPT[:12], list(range(12)))
    assert int(short.tokens[0]) == token
    # the same session grows past its window: blocks become its own, then positions go
    res = ok(eng.run([BranchOp(2, 12, PROMPT[12:], score_last=1, kv_window=WINDOW)])[0])
    s = eng.store.get(2)
    assert not s.blocks and s.gap > 0 and s.entries <= SINK + WINDOW + WINDOW // 4
    assert all(b.refs == 1 for b in eng.store.get(1).blocks)  # session 1 still holds its blocks alone
    # positions 12..: fed with the full prefix visible, then the old ones dropped: compare
    # with the same steps on a store without a prefix cache
    plain = engine(model, prefix_cache=False)
    ok(plain.run([BranchOp(2, 0, PROMPT[:12], score_last=1, kv_window=WINDOW)])[0])
    ref = ok(plain.run([BranchOp(2, 12, PROMPT[12:], score_last=1, kv_window=WINDOW)])[0])
    assert int(res.tokens[0]) == int(ref.tokens[0])
    np.testing.assert_allclose(res.token_probs, ref.token_probs, atol=1e-5)
