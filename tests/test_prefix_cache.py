"""Prefix KV cache: shared blocks give the same results as computing the prefix, are reused
across sessions and chunked sends, are reference counted, and yield to live sessions."""
import numpy as np

from support.fixtures_engine import ToyLM
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, KVBudgetFull
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig
from tokenrouter_backend.engine.kv_session import KVShape
from tokenrouter_backend.engine.kv_store import KVStore
from tokenrouter_backend.engine.prefix_cache import PrefixCache, block_key

BLOCK = 4
SYSTEM = tuple(range(3, 3 + 18))  # 4 full blocks + 2 tokens


def engine(cache=True, model=None, store=None, **cfg):
    model = model or ToyLM(max_positions=256)
    config = EngineConfig(prefix_cache=cache, prefix_cache_block_tokens=BLOCK, **cfg)
    return BranchEngine(model, store=store, config=config, name="heavy")


def ok(result):
    assert not isinstance(result, Exception), result
    return result


def run1(eng, op):
    return ok(eng.run([op])[0])


def same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.token_probs, b.token_probs, atol=1e-5)
    np.testing.assert_allclose(a.input_probs, b.input_probs, atol=1e-5)
    assert a.session_len == b.session_len


def conversation(eng, sid, prompt, steps=3):
    """Prefill with a draft, then verify-like steps feeding the drafts back."""
    results = [run1(eng, BranchOp(sid, 0, prompt, draft_len=3, score_last=1))]
    seq = list(prompt) + [int(t) for t in results[-1].tokens]
    for _ in range(steps):
        keep = results[-1].session_len
        res = run1(eng, BranchOp(sid, keep, tuple(seq[keep:]), draft_len=2, score_last=len(seq) - keep))
        results.append(res)
        seq += [int(t) for t in res.tokens[-2:]]
    return results


def test_shared_prefixes_of_every_length_match_no_cache():
    cached, plain = engine(True), engine(False)
    prompts = [SYSTEM + (40, 41), SYSTEM + (42,), SYSTEM[:9] + (7, 7, 7), SYSTEM[:16], SYSTEM[:3] + (9,),
               SYSTEM + (40, 41, 44, 45, 46, 47)]
    reused = []
    for sid, prompt in enumerate(prompts, start=1):
        a, b = conversation(cached, sid, prompt), conversation(plain, sid, prompt)
        for x, y in zip(a, b):
            same(x, y)
        reused.append(a[0].reused_tokens)
        assert all(r.reused_tokens == 0 for r in b)
    # the first sees nothing; later prompts reuse the cached blocks their prefix covers, and a
    # block's leading positions are copied where the prompt's last tokens must still be fed
    assert reused[0] == 0
    assert reused[1] == 16  # 4 blocks; block 5 has 3 of its tokens only: it cannot be named
    assert reused[2] == 8  # SYSTEM[:9] covers 2 whole blocks; block 3 differs
    assert reused[3] == 15  # all but the last position (it must be fed to score it)
    assert reused[4] == 0  # shorter than a block
    assert reused[5] == 20  # SYSTEM + (40, 41): block 5 was cached by the first prompt


def test_chunked_sends_reuse_every_chunk():
    cached, plain = engine(True), engine(False)
    prompt = tuple(int(t) for t in np.random.default_rng(1).integers(1, 50, 40))
    for eng in (cached, plain):
        conversation(eng, 1, prompt, steps=1)
        eng.run([BranchOp(1, 0, (1,), release=True)])

    def chunked(eng, sid):
        out = []
        for start in range(0, 32, 16):  # two leading chunks of 16, then the rest scored
            out.append(run1(eng, BranchOp(sid, start, prompt[start:start + 16], score_last=1)))
        out.append(run1(eng, BranchOp(sid, 32, prompt[32:], draft_len=3, score_last=1)))
        return out

    a, b = chunked(cached, 2), chunked(plain, 2)
    same(a[-1], b[-1])
    assert [r.reused_tokens for r in a] == [15, 15, 7]  # per chunk all but its last position
    assert sum(cached.last_forward_tokens) < sum(plain.last_forward_tokens)


def test_truncation_into_shared_blocks_and_rollback():
    cached, plain = engine(True), engine(False)
    prompt = SYSTEM + (40, 41)
    for eng in (cached, plain):
        conversation(eng, 1, prompt, steps=2)  # promotes prompt and generated blocks
    a = run1(cached, BranchOp(1, 6, (44, 45, 46), draft_len=3, score_last=3))  # keep 6: inside block 2
    b = run1(plain, BranchOp(1, 6, (44, 45, 46), draft_len=3, score_last=3))
    same(a, b)
    a = run1(cached, BranchOp(1, a.session_len, (int(a.tokens[-1]),), draft_len=2))
    b = run1(plain, BranchOp(1, b.session_len, (int(b.tokens[-1]),), draft_len=2))
    same(a, b)


def test_blocks_are_shared_counted_and_kept_after_release():
    eng = engine(True)
    store = eng.store
    conversation(eng, 1, SYSTEM, steps=1)
    conversation(eng, 2, SYSTEM + (9,), steps=1)
    cache = store.prefix_cache
    s1, s2 = store.get(1), store.get(2)
    shared = [b for b in s1.blocks if b in s2.blocks]
    assert len(shared) == 4 and all(b.refs == 2 for b in shared)
    blocks = cache.block_count
    eng.run([BranchOp(1, 0, (1,), release=True), BranchOp(2, 0, (1,), release=True)])
    assert store.session_count == 0 and store.session_bytes == 0
    assert cache.block_count == blocks and cache.idle_bytes == cache.bytes > 0
    assert all(b.refs == 0 for b in shared)


def test_a_session_served_in_one_step_shares_its_prompt_after_release():
    # a short request's light session: one step (prefill + drafts), then released; its
    # blocks are promoted at release, so the next request with the same prompt reuses them
    cached, plain = engine(True), engine(False)
    prompt = SYSTEM + (40, 41)  # 20 tokens: 5 full blocks
    first = run1(cached, BranchOp(1, 0, prompt, draft_len=3, score_last=1))
    cached.run([BranchOp(1, 0, (1,), release=True)])
    assert cached.store.session_count == 0 and cached.store.session_bytes == 0
    assert cached.store.prefix_cache.block_count == 5
    again = run1(cached, BranchOp(2, 0, prompt, draft_len=3, score_last=1))
    assert first.reused_tokens == 0 and again.reused_tokens == 19  # all but the scored last position
    same(again, run1(plain, BranchOp(1, 0, prompt, draft_len=3, score_last=1)))


def test_idle_blocks_yield_to_new_sessions_but_shared_ones_stay():
    model = ToyLM(max_positions=256)
    shape = KVShape.from_info(model.info)
    per_token = shape.bytes_per_token()
    store = KVStore(shape, budget_bytes=240 * per_token, name="heavy", prefix_cache=PrefixCache(BLOCK))
    eng = engine(True, model=model, store=store)
    conversation(eng, 1, tuple(range(1, 49)), steps=1)  # 48-token prompt (vocabulary 50)
    eng.run([BranchOp(1, 0, (1,), release=True)])
    idle = store.prefix_cache.bytes
    assert idle >= 48 * per_token and store.session_bytes == 0
    conversation(eng, 2, tuple(range(1, 33)) + (7, 7), steps=1)  # shares 8 blocks with session 1
    live_blocks = set(map(id, store.get(2).blocks))
    # 13 cached blocks (8 shared) + session 2's tail of 64 positions: 116 of 240 positions in
    # use; a session of 120 needs the room of idle blocks: they go, shared ones stay
    ok(eng.run([BranchOp(3, 0, tuple(int(t) for t in np.arange(120) % 47 + 2), score_last=1)])[0])
    assert store.prefix_cache.stats.evicted_blocks > 0
    assert live_blocks <= {id(b) for b in store.prefix_cache._blocks.values()}
    assert store.bytes_in_use <= 240 * per_token
    # when even without idle blocks it cannot fit, the new session is refused, not the live ones
    res = eng.run([BranchOp(4, 0, tuple(int(t) for t in np.arange(199) % 49 + 1), score_last=1)])[0]
    assert isinstance(res, KVBudgetFull)
    assert 2 in store and 3 in store


def test_block_key_is_a_chain():
    a = block_key(b"", (1, 2, 3, 4))
    assert block_key(b"", (1, 2, 3, 4)) == a
    assert block_key(a, (5, 6, 7, 8)) != block_key(block_key(b"", (1, 2, 3, 5)), (5, 6, 7, 8))
    assert len(a) == 16


def test_cache_off_keeps_sessions_private():
    eng = engine(False)
    conversation(eng, 1, SYSTEM, steps=1)
    assert eng.store.prefix_cache is None and not eng.store.get(1).blocks


def test_idle_blocks_yield_to_a_growing_live_session():
    model = ToyLM(max_positions=256)
    shape = KVShape.from_info(model.info)
    per_token = shape.bytes_per_token()
    store = KVStore(shape, budget_bytes=200 * per_token, name="heavy", prefix_cache=PrefixCache(BLOCK))
    eng = engine(True, model=model, store=store)
    conversation(eng, 1, tuple(int(t) for t in np.arange(100) % 47 + 1), steps=1)
    eng.run([BranchOp(1, 0, (1,), release=True)])
    assert store.prefix_cache.idle_bytes >= 100 * per_token
    keep, peak = 0, 0
    for i in range(8):  # a live session grows by 16 tokens a step to 128
        ids = tuple(int(t) for t in (np.arange(16) + 3 * i) % 43 + 2)
        keep = ok(eng.run([BranchOp(2, keep, ids, score_last=1)])[0]).session_len
        peak = max(peak, store.bytes_in_use)
    assert peak <= 200 * per_token and store.prefix_cache.stats.evicted_blocks > 0
