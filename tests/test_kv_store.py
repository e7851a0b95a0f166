"""KVStore: truncate/append, growth, gather padding, TTL, LRU under a budget, accounting."""
import numpy as np
import pytest

from tokenrouter_backend.core.protocol.branch_protocol import BranchError, KVBudgetFull, SessionMissing
from tokenrouter_backend.engine.kv_session import MIN_CAPACITY, KVShape
from tokenrouter_backend.engine.kv_store import KVStore

SHAPE = KVShape(num_layers=2, num_kv_heads=2, head_dim=4, dtype=np.dtype(np.float32), max_len=1000)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def kv(batch, seq, start=0.0):
    """Per-layer (key, value) [B, H, S, D] whose values encode (layer, kv, b, h, s, d)."""
    out = []
    for layer in range(SHAPE.num_layers):
        base = np.arange(batch * 2 * seq * 4, dtype=np.float32).reshape(batch, 2, seq, 4) + start
        out.append((base + 1000 * layer, base + 1000 * layer + 500))
    return out


def test_append_truncate_gather_left_pads():
    store = KVStore(SHAPE)
    a, b = store.open(1, 0), store.open(2, 0)
    store.append(a, kv(1, 5), row=0, count=5)
    store.append(b, kv(2, 3, start=7), row=1, count=2)  # row 1, only 2 of 3 tokens
    assert (a.length, b.length) == (5, 2)
    past = store.gather([a, b])
    k0, v1 = past[0][0], past[1][1]
    assert k0.shape == (2, 2, 5, 4) and k0.flags.c_contiguous
    np.testing.assert_array_equal(k0[0], kv(1, 5)[0][0][0])
    np.testing.assert_array_equal(k0[1, :, :3], 0)  # left padding is zeros
    np.testing.assert_array_equal(k0[1, :, 3:], kv(2, 3, start=7)[0][0][1, :, :2])
    np.testing.assert_array_equal(v1[1, :, 3:], kv(2, 3, start=7)[1][1][1, :, :2])
    # truncation is just the length: re-append overwrites the rolled-back tail
    a = store.open(1, 2)
    store.append(a, kv(1, 1, start=99), row=0, count=1)
    k = store.gather([a])[0][0]
    assert k.shape[2] == 3
    np.testing.assert_array_equal(k[0, :, 2], kv(1, 1, start=99)[0][0][0, :, 0])


def test_growth_steps_and_keeps_content():
    store = KVStore(SHAPE)
    s = store.open(1, 0)
    first = kv(1, MIN_CAPACITY)
    store.append(s, first, 0, MIN_CAPACITY)
    assert s.capacity == MIN_CAPACITY
    store.append(s, kv(1, 1, start=5), 0, 1)
    assert s.capacity == 2 * MIN_CAPACITY
    assert store.bytes_in_use == 2 * MIN_CAPACITY * SHAPE.bytes_per_token()
    np.testing.assert_array_equal(store.gather([s])[0][0][0, :, :MIN_CAPACITY], first[0][0][0])


def test_missing_and_bad_keep_len_messages():
    store = KVStore(SHAPE, name="light")
    with pytest.raises(SessionMissing, match=r"light: session 9 .*keep_len 3"):
        store.open(9, 3)
    s = store.open(9, 0)
    store.append(s, kv(1, 2), 0, 2)
    with pytest.raises(BranchError, match=r"keep_len 5 .* 2 tokens"):
        store.open(9, 5)


def test_ttl_expiry_then_missing():
    clock = Clock()
    store = KVStore(SHAPE, ttl_s=10, clock=clock)
    store.append(store.open(1, 0), kv(1, 2), 0, 2)
    clock.t = 5
    store.append(store.open(2, 0), kv(1, 2), 0, 2)
    clock.t = 12  # session 1 idle 12 s > 10, session 2 idle 7 s
    assert store.expire() == [1]
    assert store.session_count == 1
    clock.t = 16  # session 2 now expired but not swept: still reported missing
    with pytest.raises(SessionMissing):
        store.open(2, 2)
    assert store.session_count == 0 and store.bytes_in_use == 0


def test_budget_refuses_new_sessions_never_evicts():
    per_session = MIN_CAPACITY * SHAPE.bytes_per_token()
    clock = Clock()
    store = KVStore(SHAPE, budget_bytes=2 * per_session, clock=clock)
    for sid in (1, 2):
        store.admit(sid, 1)
        store.append(store.open(sid, 0), kv(1, 1), 0, 1)
    with pytest.raises(KVBudgetFull, match="kv_cache_budget_mb"):
        store.admit(3, 1)
    store.admit(1, 500)  # an existing session is never refused
    assert 1 in store and 2 in store and store.refused == 1
    store.release(2)
    store.admit(3, 1)


def test_growth_slack_stays_small_for_long_sessions():
    store = KVStore(SHAPE)
    s = store.open(1, 0)
    store.reserve(s, 3000)
    assert 3000 <= s.capacity < 3000 * 1.3  # not the next power of two (4096)


def test_accounting_back_to_zero():
    store = KVStore(SHAPE)
    for sid in range(5):
        store.append(store.open(sid, 0), kv(1, 70), 0, 70)
    assert store.session_count == 5 and store.bytes_in_use > 0
    for sid in range(5):
        assert store.release(sid)
    assert not store.release(0)
    assert store.session_count == 0 and store.bytes_in_use == 0
