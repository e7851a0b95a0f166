"""RemoteBranch against a fake Triton gRPC endpoint (no tritonserver, no GPU)."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from support.fake_triton_grpc import FakeBranchServer, scripted  # pytest puts tests/ on sys.path
from tokenrouter_backend.branches.remote import HEAVY_URL_ENV, RemoteBranch, resolve_heavy_url
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchError,
    BranchOp,
    BranchResult,
    Sampling,
    SessionMissing,
)

FAST = dict(timeout_s=5.0, connect_retries=2, backoff_s=0.05)


def free_port() -> int:
    with FakeBranchServer(scripted) as fake:
        return fake.port


def run(coro):
    return asyncio.run(coro)


async def one_step(branch: RemoteBranch, op: BranchOp, close: bool = True) -> BranchResult:
    try:
        return await branch.step(op)
    finally:
        if close:
            await branch.close()


OP = BranchOp(session_id=2**63 + 5, keep_len=7, input_ids=(10, 11, 12), draft_len=4,
              min_confidence=0.25, max_entropy=2.5,
              sampling=Sampling(temperature=0.75, top_k=5, top_p=0.875, seed=42), return_dist=True)


def test_step_round_trip_sends_the_op_and_decodes_the_result():
    with FakeBranchServer(scripted) as fake:
        res = run(one_step(RemoteBranch("heavy", fake.url, **FAST), OP))
    assert fake.ops == [("heavy", OP)]  # every field crossed the wire intact
    assert res.tokens.tolist() == [11, 12, 13]
    np.testing.assert_allclose(res.token_probs, [0.5, 0.7, 0.9], rtol=1e-6)
    assert res.input_probs.tolist() == [0.75, 0.75]
    assert res.session_len == 10 and res.batch_size == 3 and res.forward_ms == 1.5
    assert res.dist is not None and res.dist.shape == (3, 4)


def test_no_dist_unless_asked_and_model_name_override():
    op = BranchOp(session_id=1, keep_len=0, input_ids=(5,))
    with FakeBranchServer(scripted) as fake:
        res = run(one_step(RemoteBranch("heavy", fake.url, model="heavy_fp16", **FAST), op))
    assert fake.ops[0][0] == "heavy_fp16"
    assert res.dist is None and res.input_probs.size == 0


def test_remote_error_names_url_and_model():
    def broken(op):
        raise RuntimeError("forward failed: out of memory")

    with FakeBranchServer(broken) as fake:
        with pytest.raises(BranchError) as err:
            run(one_step(RemoteBranch("heavy", fake.url, **FAST), OP))
    msg = str(err.value)
    assert fake.url in msg and "'heavy'" in msg and "out of memory" in msg
    assert not isinstance(err.value, SessionMissing)
    assert len(fake.ops) == 1  # a model error is not retried


def test_session_missing_crosses_the_wire():
    def expired(op):
        raise SessionMissing("heavy: session 1 does not exist")

    with FakeBranchServer(expired) as fake:
        with pytest.raises(SessionMissing):
            run(one_step(RemoteBranch("heavy", fake.url, **FAST), OP))


def test_timeout_is_a_branch_error():
    with FakeBranchServer(scripted) as fake:
        fake.delay_s = 1.0
        t0 = time.monotonic()
        with pytest.raises(BranchError, match="no answer within 0.3 s"):
            run(one_step(RemoteBranch("heavy", fake.url, timeout_s=0.3, connect_retries=0), OP))
        assert time.monotonic() - t0 < 0.9


def test_remote_down_fails_quickly_with_a_clear_error():
    url = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(BranchError) as err:
        run(one_step(RemoteBranch("heavy", url, **FAST), OP))
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, f"down remote took {elapsed:.1f} s to fail"
    msg = str(err.value)
    assert url in msg and "'heavy'" in msg and "unreachable after 3 attempts" in msg


def test_remote_comes_back_and_the_next_call_works():
    fake = FakeBranchServer(scripted).start()
    branch = RemoteBranch("heavy", fake.url, **FAST)

    async def scenario():
        first = await branch.step(OP)
        fake.stop()
        with pytest.raises(BranchError, match="unreachable"):
            await branch.step(OP)
        fake.start()  # same port
        again = await branch.step(OP)
        await branch.close()
        return first, again

    try:
        first, again = run(scenario())
    finally:
        fake.stop()
    assert first.tokens.tolist() == again.tokens.tolist() == [11, 12, 13]


def test_connect_retry_rides_out_a_slow_start():
    fake = FakeBranchServer(scripted, port=free_port())
    timer = threading.Timer(0.3, fake.start)
    timer.start()
    try:
        res = run(one_step(RemoteBranch("heavy", fake.url, timeout_s=5.0, connect_retries=6,
                                        backoff_s=0.1), OP))
    finally:
        timer.join()
        fake.stop()
    assert res.tokens.tolist() == [11, 12, 13]


def test_release_never_raises_and_close_stops_steps():
    url = f"127.0.0.1:{free_port()}"
    branch = RemoteBranch("heavy", url, timeout_s=1.0, connect_retries=0)

    async def scenario():
        await branch.release(3)  # remote down: still no exception
        await branch.close()
        with pytest.raises(BranchError, match="closed"):
            await branch.step(OP)

    run(scenario())


def test_release_reaches_the_remote():
    with FakeBranchServer(scripted) as fake:
        branch = RemoteBranch("light", fake.url, **FAST)

        async def scenario():
            await branch.release(9)
            await branch.close()

        run(scenario())
    (model, op), = fake.ops
    assert model == "light" and op.release and op.session_id == 9


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="url is empty"):
        RemoteBranch("heavy", "")
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteBranch("heavy", "h:1", timeout_s=0)


def test_resolve_heavy_url_env_wins(monkeypatch):
    monkeypatch.delenv(HEAVY_URL_ENV, raising=False)
    assert resolve_heavy_url("") == ""
    assert resolve_heavy_url(None) == ""
    assert resolve_heavy_url(" heavy:8001 ") == "heavy:8001"
    monkeypatch.setenv(HEAVY_URL_ENV, "10.0.0.9:8001")
    assert resolve_heavy_url("heavy:8001") == "10.0.0.9:8001"


def test_server_killed_under_concurrent_steps_fails_every_one_by_name():
    """Concurrent steps share a channel: a failing step must not close it under the others
    (their awaits would end in asyncio.CancelledError: requests without an answer)."""
    fake = FakeBranchServer(scripted).start()
    fake.delay_s = 0.5

    async def scenario():
        branch = RemoteBranch("heavy", fake.url, timeout_s=10.0, connect_retries=3, backoff_s=0.02)
        try:
            tasks = [asyncio.ensure_future(branch.step(BranchOp(i, 0, (1, 2)))) for i in range(12)]
            await asyncio.sleep(0.2)  # every step is in the server
            stopper = threading.Thread(target=fake.stop)
            stopper.start()
            done, pending = await asyncio.wait(tasks, timeout=8.0)
            stopper.join()
            return [t.exception() if not t.cancelled() else asyncio.CancelledError() for t in done], len(pending)
        finally:
            await branch.close()

    try:
        outcomes, pending = run(scenario())
    finally:
        fake.stop()
    assert pending == 0, f"{pending} steps hang after the server died"
    for exc in outcomes:
        assert isinstance(exc, BranchError), repr(exc)
        assert "heavy branch (model 'heavy' at grpc://" in str(exc)
