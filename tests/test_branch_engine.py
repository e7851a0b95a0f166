"""BranchEngine on a numpy toy LM (padding/truncation bugs change its outputs) and a tiny ONNX Qwen2."""
import dataclasses
import math

import numpy as np
import pytest

from support.fixtures_engine import ToyLM
from tokenrouter_backend.core.loop.sampling import entropy, softmax
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchError,
    BranchOp,
    KVBudgetFull,
    Sampling,
    SessionMissing,
)
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig
from tokenrouter_backend.engine.kv_session import KVShape
from tokenrouter_backend.engine.kv_store import KVStore

PROMPTS = {1: (3, 4, 5), 2: (7,), 3: (9, 8, 7, 6, 5, 4, 3, 2), 4: (11, 12)}


def engine(model=None, **cfg):
    return BranchEngine(model or ToyLM(), config=EngineConfig(**cfg), name="light")


def ok(result):
    assert not isinstance(result, Exception), result
    return result


def prefill(eng, prompts=PROMPTS):
    return [ok(r) for r in eng.run([BranchOp(sid, 0, ids) for sid, ids in prompts.items()])]


def full_prefix_greedy(model, ids):
    """Reference without any cache: greedy choice and top-1 prob after each prefix position."""
    x = np.asarray(ids, dtype=np.int64)[None]
    logits, _ = model.forward(x, np.ones_like(x), np.arange(x.shape[1])[None], model.empty_past(1))
    probs = softmax(logits[0])
    return probs.argmax(-1), probs.max(-1), probs


def assert_same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.token_probs, b.token_probs, atol=1e-5)
    np.testing.assert_allclose(a.entropy, b.entropy, atol=1e-4)
    np.testing.assert_allclose(a.input_probs, b.input_probs, atol=1e-5)
    assert a.session_len == b.session_len


def step_ops():
    return [
        BranchOp(1, 3, (6, 7), draft_len=4),
        BranchOp(2, 1, (1, 2, 3, 4, 5), draft_len=0),
        BranchOp(3, 5, (13,), draft_len=6, sampling=Sampling(temperature=0.9, top_k=20, top_p=0.9, seed=5)),
        BranchOp(4, 0, (20, 21, 22), draft_len=2, return_dist=True),  # rollback to 0 = restart
    ]


def test_prefill_matches_uncached_model():
    model = ToyLM()
    results = prefill(engine(model))
    for ids, res in zip(PROMPTS.values(), results):
        tokens, top1, probs = full_prefix_greedy(model, ids)
        np.testing.assert_array_equal(res.tokens, tokens)
        np.testing.assert_allclose(res.token_probs, top1, atol=1e-5)
        np.testing.assert_allclose(res.entropy, entropy(probs), atol=1e-5)
        np.testing.assert_allclose(res.input_probs, probs[np.arange(len(ids) - 1), ids[1:]], atol=1e-6)
        assert res.session_len == len(ids) and res.batch_size == 4


def test_batched_equals_one_at_a_time():
    batched, single = engine(), engine()
    prefill(batched)
    prefill(single)
    together = batched.run(step_ops())
    assert batched.last_batch_sizes[0] == 4
    for op, res in zip(step_ops(), together):
        (alone,) = single.run([op])
        assert_same(ok(res), ok(alone))
        assert res.batch_size == 4 and alone.batch_size == 1


def test_extend_and_draft_match_uncached_model():
    model = ToyLM()
    eng = engine(model)
    prefill(eng)
    res = ok(eng.run([BranchOp(1, 2, (9, 9), draft_len=5)])[0])
    history = PROMPTS[1][:2] + (9, 9)
    n = 2
    # drafted tokens: tokens[n-1:], fed back one at a time; check against full recompute
    seq = history + tuple(int(t) for t in res.tokens[n - 1:-1])
    ref_tokens, ref_p, ref_probs = full_prefix_greedy(model, seq)
    np.testing.assert_array_equal(res.tokens, ref_tokens[2:])
    np.testing.assert_allclose(res.token_probs, ref_p[2:], atol=1e-5)
    np.testing.assert_allclose(res.input_probs, [ref_probs[2, 9]], atol=1e-5)
    assert len(res.tokens) == n + 5 - 1 and res.session_len == 2 + n + 5 - 1


def test_rollback_then_reextend_equals_fresh_session():
    eng = engine()
    prefill(eng)
    ok(eng.run([BranchOp(3, 8, (1, 2, 3), draft_len=4)])[0])  # grow, then roll back below it
    rolled = ok(eng.run([BranchOp(3, 4, (40, 41), draft_len=3)])[0])
    fresh = ok(engine().run([BranchOp(3, 0, PROMPTS[3][:4] + (40, 41), draft_len=3)])[0])
    np.testing.assert_array_equal(rolled.tokens, fresh.tokens[4:])
    np.testing.assert_allclose(rolled.token_probs, fresh.token_probs[4:], atol=1e-5)
    assert rolled.session_len == fresh.session_len


def test_drafting_stops_at_min_confidence_and_max_entropy():
    eng = engine(max_draft_len=12)
    full = ok(eng.run([BranchOp(1, 0, (3, 4), draft_len=12)])[0])
    drafted = full.token_probs[1:]
    assert len(drafted) == 12
    cut = float(np.sort(drafted)[len(drafted) // 2])  # some drafted token falls below it
    stop = int(np.argmax(drafted < cut))
    res = ok(eng.run([BranchOp(1, 0, (3, 4), draft_len=12, min_confidence=cut)])[0])
    assert len(res.tokens) == 2 + stop  # the weak token itself is still returned
    assert res.token_probs[-1] < cut and np.all(res.token_probs[1:-1] >= cut)
    assert res.session_len == 2 + stop
    ent_cut = float(np.sort(full.entropy[1:])[len(drafted) // 2])
    ent_stop = int(np.argmax(full.entropy[1:] > ent_cut))
    res = ok(eng.run([BranchOp(1, 0, (3, 4), draft_len=12, max_entropy=ent_cut)])[0])
    assert len(res.tokens) == 2 + ent_stop


def test_greedy_dist_is_the_softmax():
    model = ToyLM()
    res = ok(engine(model).run([BranchOp(1, 0, (3, 4, 5), return_dist=True)])[0])
    _, _, probs = full_prefix_greedy(model, (3, 4, 5))
    np.testing.assert_allclose(res.dist, probs, atol=1e-6)


def test_sampling_is_seeded_and_dist_returned():
    s = Sampling(temperature=1.0, top_k=10, seed=42)
    ops = [BranchOp(1, 0, (3, 4, 5), draft_len=5, sampling=s, return_dist=True)]
    a, b = ok(engine().run(ops)[0]), ok(engine().run(ops)[0])
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.dist.shape == (len(a.tokens), 50)
    assert np.all((a.dist > 0).sum(-1) <= 10)
    np.testing.assert_allclose(a.dist[np.arange(len(a.tokens)), a.tokens], a.token_probs, atol=1e-6)
    other = ok(engine().run([BranchOp(1, 0, (3, 4, 5), draft_len=5, sampling=Sampling(1.0, 10, 1.0, 43))])[0])
    assert other.dist is None
    assert not np.array_equal(other.tokens, a.tokens) or len(a.tokens) < 3


def test_bad_op_fails_alone():
    eng = engine(max_draft_len=4)
    prefill(eng)
    ops = [
        BranchOp(1, 3, (6,), draft_len=2),  # good
        BranchOp(77, 2, (1,)),  # session never existed
        BranchOp(2, 5, (1,)),  # keep_len beyond the session's 1 token
        BranchOp(3, 8, (1,) * 60),  # 68 > 64 positions
        BranchOp(4, 2, (1,), draft_len=5),  # draft_len above max_draft_len
        BranchOp(5, 0, (1, 50)),  # token outside the vocabulary of 50
    ]
    res = eng.run(ops)
    alone = engine(max_draft_len=4)
    prefill(alone)
    assert_same(ok(res[0]), ok(alone.run([ops[0]])[0]))
    assert isinstance(res[1], SessionMissing) and "session 77" in str(res[1])
    assert isinstance(res[2], BranchError) and "keep_len 5" in str(res[2]) and "1 tokens" in str(res[2])
    assert isinstance(res[3], BranchError) and "64" in str(res[3]) and "68" in str(res[3])
    assert isinstance(res[4], BranchError) and "draft_len 5" in str(res[4])
    assert isinstance(res[5], BranchError) and "token 50, outside the vocabulary 0..49" in str(res[5])
    assert 5 not in eng.store
    assert all(str(r).startswith("light:") for r in res[1:])
    assert eng.store.get(2).length == 1  # failed ops leave their sessions untouched


def test_model_failure_fails_its_group_only():
    class Broken(ToyLM):
        def forward(self, input_ids, *args):
            if 49 in input_ids:
                raise RuntimeError("boom")
            return super().forward(input_ids, *args)

    eng = engine(Broken(), max_batch=1)
    res = eng.run([BranchOp(1, 0, (49,)), BranchOp(2, 0, (3,))])
    assert isinstance(res[0], BranchError) and "boom" in str(res[0])
    ok(res[1])


def test_same_session_twice_runs_in_order_and_release():
    eng = engine()
    res = eng.run([BranchOp(1, 0, (3, 4)), BranchOp(1, 2, (5,)), BranchOp(1, 0, (0,), release=True),
                   BranchOp(2, 0, (3, 4, 5))])
    assert ok(res[1]).session_len == 3
    np.testing.assert_array_equal(res[1].tokens, res[3].tokens[2:])
    assert ok(res[2]).session_len == 0 and 1 not in eng.store
    assert eng.store.session_count == 1


def test_max_batch_splits_forwards():
    model = ToyLM()
    eng = engine(model, max_batch=3)
    prefill(eng)
    assert eng.last_batch_sizes == [3, 1]


def test_ttl_budget_and_accounting_through_engine():
    clock = [0.0]
    model = ToyLM()
    shape = KVShape.from_info(model.info)
    per_session = 64 * shape.bytes_per_token()
    store = KVStore(shape, ttl_s=30, budget_bytes=2 * per_session, name="heavy", clock=lambda: clock[0])
    eng = BranchEngine(model, store, EngineConfig(), name="heavy")
    for sid in (1, 2):
        clock[0] += 1
        ok(eng.run([BranchOp(sid, 0, (1, 2))])[0])
    clock[0] += 1
    res = eng.run([BranchOp(3, 0, (1, 2)), BranchOp(1, 2, (5,))])
    assert isinstance(res[0], KVBudgetFull) and "kv_cache_budget_mb" in str(res[0])  # full: 3 refused
    ok(res[1])  # the live sessions go on: nothing was evicted for the newcomer
    assert sorted(store._sessions) == [1, 2] and store.refused == 1
    clock[0] += 31
    eng.run([])  # TTL sweep
    assert store.session_count == 0 and store.bytes_in_use == 0
    res = eng.run([BranchOp(1, 2, (5,))])[0]
    assert isinstance(res, SessionMissing) and "heavy" in str(res)
    ok(eng.run([BranchOp(3, 0, (1, 2))])[0])  # room again


def test_release_returns_memory_to_zero():
    eng = engine()
    prefill(eng)
    assert eng.store.bytes_in_use > 0
    res = eng.run([BranchOp(sid, 0, (), release=True) for sid in PROMPTS])
    assert all(ok(r).session_len == 0 for r in res)
    assert eng.store.session_count == 0 and eng.store.bytes_in_use == 0


def test_infinite_max_entropy_default():
    assert BranchOp(1, 0, (1,)).max_entropy == math.inf


# ---- real ONNX (tiny random Qwen2, exported in the fixture) -----------------------------
@pytest.fixture(scope="module")
def onnx_lm(tiny_qwen_dir):
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM

    return OnnxCausalLM(tiny_qwen_dir, intra_op_threads=1)


def test_onnx_prefill_matches_uncached(onnx_lm):
    prompts = {1: (3, 4, 5, 100, 200), 2: (7,), 3: tuple(range(20, 40))}
    results = prefill(engine(onnx_lm), prompts)
    for ids, res in zip(prompts.values(), results):
        tokens, top1, _ = full_prefix_greedy(onnx_lm, ids)
        np.testing.assert_array_equal(res.tokens, tokens)
        np.testing.assert_allclose(res.token_probs, top1, atol=1e-4)


def test_onnx_batched_equals_one_at_a_time_and_uncached(onnx_lm):
    prompts = {1: (3, 4, 5, 100, 200), 2: (7,), 3: tuple(range(20, 40)), 4: (250, 251)}
    batched, single = engine(onnx_lm), engine(onnx_lm)
    prefill(batched, prompts)
    prefill(single, prompts)
    ops = [BranchOp(1, 3, (6, 7), draft_len=4), BranchOp(2, 1, (1, 2, 3, 4, 5)),
           BranchOp(3, 12, (13,), draft_len=6), BranchOp(4, 2, (9,), draft_len=3)]
    for op, res in zip(ops, batched.run(ops)):
        (alone,) = single.run([op])
        np.testing.assert_array_equal(ok(res).tokens, ok(alone).tokens)
        np.testing.assert_allclose(res.token_probs, alone.token_probs, atol=1e-4)
        np.testing.assert_allclose(res.input_probs, alone.input_probs, atol=1e-4)
        assert res.session_len == alone.session_len
        fed = tuple(int(t) for t in res.tokens[len(op.input_ids) - 1:-1])
        seq = prompts[op.session_id][: op.keep_len] + op.input_ids + fed
        assert len(seq) == res.session_len
        ref, _, _ = full_prefix_greedy(onnx_lm, seq)
        np.testing.assert_array_equal(res.tokens, ref[op.keep_len:])


def test_live_sessions_are_never_evicted_and_growth_is_allowed():
    model = ToyLM()
    shape = KVShape.from_info(model.info)
    store = KVStore(shape, budget_bytes=64 * shape.bytes_per_token())  # room for one session
    eng = BranchEngine(model, store, EngineConfig(max_batch=1))
    ok(eng.run([BranchOp(1, 0, (1, 2))])[0])
    res = eng.run([BranchOp(sid, 0, (1, 2)) for sid in (2, 3)])
    assert all(isinstance(r, KVBudgetFull) for r in res)
    grown = ok(eng.run([BranchOp(1, 2, tuple(range(3, 40)), draft_len=2)])[0])  # an admitted session grows
    assert grown.session_len == 40 and store.session_count == 1


# ---- logits only where asked, per-forward token budget ---------------------------------
LONG = {1: tuple(range(1, 40)), 2: (7, 8), 3: tuple(range(10, 27)), 4: (5,)}


def test_score_last_returns_only_the_trailing_positions():
    full = prefill(engine(), LONG)
    ops = [BranchOp(sid, 0, ids, score_last=min(3, len(ids)), draft_len=2) for sid, ids in LONG.items()]
    for op, ref, res in zip(ops, full, engine().run(ops)):
        res = ok(res)
        s = op.score_last
        np.testing.assert_array_equal(res.tokens[:s], ref.tokens[-s:])
        np.testing.assert_allclose(res.token_probs[:s], ref.token_probs[-s:], atol=1e-5)
        np.testing.assert_allclose(res.input_probs, ref.input_probs[len(ref.input_probs) - (s - 1):], atol=1e-5)
        assert len(res.tokens) == s + 1  # + the one further draft


def test_chunked_forwards_match_one_forward_and_respect_the_budget():
    one, chunked = engine(), engine(max_forward_tokens=8)
    ops = [BranchOp(sid, 0, ids, score_last=s, draft_len=3)
           for (sid, ids), s in zip(LONG.items(), (0, 1, 5, 0))]
    for ref, res in zip(one.run(ops), chunked.run(ops)):
        np.testing.assert_array_equal(ok(res).tokens, ok(ref).tokens)
        np.testing.assert_allclose(res.token_probs, ref.token_probs, atol=1e-5)
        np.testing.assert_allclose(res.input_probs, ref.input_probs, atol=1e-5)
        assert res.session_len == ref.session_len
    assert max(chunked.last_forward_tokens) <= 8 < max(one.last_forward_tokens)
    assert chunked.largest_forward_tokens <= 8
    # the long prompt was fed alone in chunks; the short ones shared forwards
    assert len(chunked.last_forward_tokens) > len(one.last_forward_tokens)
    res = ok(chunked.run([BranchOp(1, 39, (1, 2, 3))])[0])
    assert res.forwards == 1 and res.forward_tokens == 3


def test_score_last_out_of_range_fails_alone():
    res = engine().run([BranchOp(1, 0, (1, 2), score_last=3), BranchOp(2, 0, (1, 2), score_last=2)])
    assert isinstance(res[0], BranchError) and "score_last 3 outside 0..2" in str(res[0])
    ok(res[1])


class SingleRowToy(ToyLM):
    """A ToyLM whose single-row product takes another path, as the int8-compute light model's
    kernel does (``min_rows`` 2): a one-session, one-token forward run unpadded gets shifted
    logits; padded (two copies) or inside any batch of two or more rows it gets the batch path."""

    def __init__(self):
        super().__init__()
        self.info = dataclasses.replace(self.info, min_rows=2)
        self.shapes: list[tuple[int, int, bool, tuple[int, ...]]] = []  # (batch, new, padded, new per row)

    def forward(self, input_ids, attention_mask, position_ids, past, logits_positions=None, pad=True):
        batch, new = input_ids.shape
        rows = tuple(int(n) for n in attention_mask[:, -new:].sum(axis=1))
        self.shapes.append((batch, new, pad, rows))
        logits, kv = super().forward(input_ids, attention_mask, position_ids, past, logits_positions)
        if batch * new == 1 and not pad:  # the single-row path
            logits = logits + np.linspace(0.0, 0.5, logits.shape[-1], dtype=np.float32)
        return logits, kv


LONE_PROMPTS = {1: (3, 4, 5), 2: (7, 8, 9, 10), 3: (9, 8, 7, 6, 5, 4)}
LONE_OPS = [BranchOp(1, 3, (6,), draft_len=5),  # one token: every forward of it is lone
            BranchOp(2, 4, (11, 12, 13), draft_len=4),  # a chunk of three, then lone draft steps
            BranchOp(3, 6, (2, 1), draft_len=0)]  # two tokens, no draft


def test_lone_decode_steps_run_one_token_forwards_alone_and_keep_batch_invariance():
    """``lone_decode_steps``: a one-session, one-token forward runs unpadded (the single-row
    path), no one-token row ever shares a forward, and every session gets the same result
    alone as beside the others. Without it the same step runs padded (the batch path)."""
    together, lone_eng = SingleRowToy(), engine(SingleRowToy(), lone_decode_steps=True)
    both = engine(together, lone_decode_steps=True)
    prefill(both, LONE_PROMPTS)
    prefill(lone_eng, LONE_PROMPTS)
    together.shapes.clear()
    results = [ok(r) for r in both.run(LONE_OPS)]
    for op, res in zip(LONE_OPS, results):
        (alone,) = lone_eng.run([op])
        assert_same(res, ok(alone))  # the toy's own float noise across shapes is ~1e-7
        assert res.lone_steps and len(res.tokens) == len(op.input_ids) - 1 + max(op.draft_len, 1)
    for batch, new, padded, rows in together.shapes:
        if batch * new == 1:
            assert not padded  # a lone step runs as given
        else:
            assert padded and min(rows) >= 2, (batch, new, rows)  # never a one-token row in a batch
    assert sum(b * n == 1 for b, n, _, _ in together.shapes) == 5 + 3  # op 1's feed + 4 drafts; op 2's 3 drafts

    shared = engine(SingleRowToy(), lone_decode_steps=False)  # the same one-token steps padded and batched
    prefill(shared, LONE_PROMPTS)
    first = ok(shared.run(LONE_OPS[:1])[0])
    assert not first.lone_steps and np.abs(first.token_probs - results[0].token_probs).max() > 1e-3
    assert all(padded for _, _, padded, _ in shared.model.shapes)


def test_lone_decode_steps_change_nothing_for_a_model_without_a_single_row_path():
    model = ToyLM()  # min_rows 1: every product is row-independent already
    eng = engine(model, lone_decode_steps=True)
    prefill(eng, LONE_PROMPTS)
    results = [ok(r) for r in eng.run(LONE_OPS)]
    assert not eng.lone and not any(r.lone_steps for r in results)
    assert max(batch for batch, _, _ in model.calls[-3:]) > 1  # draft steps still batched
