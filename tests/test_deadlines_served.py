"""Deadlines that hold, on a real tritonserver (tiny pair): a stuck branch stub fails its
requests by name within ``branch_timeout_s`` + slack and frees their admission places; the
stub going on again, the server serves with no KV session left behind. A request whose client
cancels while it waits for admission leaves the queue at once.

A stuck stub is one whose ``execute`` does not return (a deadlock in the model): the test's
repository copy gives the branch an adapter that holds ``execute`` while a file exists. A
SIGSTOPped stub is not that case: tritonserver 2.51's Python backend finds it unhealthy
(its health flag goes unanswered) and fails the call itself within about 3 s, and resuming it
then aborts the server (the stub-mutex abort of tests/test_faults.py; docs/security.md,
"Known limits").
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import re
import shutil
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.triton_repo import set_params
from tokenrouter_backend.branches.deadline import DEADLINE_SLACK_S
from tokenrouter_backend.client.triton_client import GenerationError, generate_http

pytestmark = pytest.mark.triton

BRANCH_TIMEOUT_S = 3.0
DEADLINE_S = BRANCH_TIMEOUT_S + DEADLINE_SLACK_S
SLOW_MARGIN_S = 10.0  # a loaded machine: the router's own turn, the HTTP round trip
CLIENT_TIMEOUT_S = 40.0  # a request that hangs past this is an OSError (no answer)
PROMPT = "def f(x):\n    "


HOLDING_ADAPTER = '''"""A branch model whose execute holds while the file HOLD beside it exists (a stuck stub)."""
import os
import time

from tokenrouter_backend.serving.branch_model import TritonPythonModel as Branch

HOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "HOLD")


class TritonPythonModel(Branch):
    def execute(self, requests):
        while os.path.exists(HOLD):
            time.sleep(0.02)
        return super().execute(requests)
'''


def _repository(tiny_repository: Path, out: Path, **router_params) -> Path:
    shutil.copytree(tiny_repository, out, symlinks=True)
    set_params(out / "router" / "config.pbtxt", **router_params)
    for branch in ("heavy", "light"):
        (out / branch / "1" / "model.py").write_text(HOLDING_ADAPTER)
    return out


@contextmanager
def stuck(repo: Path, model: str):
    """``model``'s stub stuck in ``execute`` for the block, going on again whatever happens."""
    hold = repo / model / "1" / "HOLD"
    hold.touch()
    try:
        yield
    finally:
        hold.unlink()


def live_sessions(server, branch: str) -> float:
    body = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    match = re.search(rf'^tokenrouter_kv_sessions\{{[^}}]*branch="{branch}"[^}}]*\}} ([0-9.e+-]+)$', body, re.M)
    assert match, f"no tokenrouter_kv_sessions for {branch}"
    return float(match.group(1))


def timed(host: str, **knobs):
    """(the answer or the error it raised, seconds it took)."""
    t0 = time.monotonic()
    try:
        return generate_http(host, PROMPT, timeout_s=CLIENT_TIMEOUT_S, **knobs), time.monotonic() - t0
    except (GenerationError, OSError) as exc:
        return exc, time.monotonic() - t0


def test_a_stuck_branch_stub_fails_its_requests_by_name_and_frees_their_places(
        tiny_repository, tmp_path, start_triton):
    repo = _repository(tiny_repository, tmp_path / "repo", branch_timeout_s=BRANCH_TIMEOUT_S,
                       max_live_requests=2, max_queued_requests=0)
    server = start_triton(repo)
    host = server.http_url.removeprefix("http://")
    ok, baseline_s = timed(host, router_mode="heavy", max_tokens=8)
    assert not isinstance(ok, Exception), ok
    with cf.ThreadPoolExecutor(2) as pool, stuck(repo, "heavy"):
        jobs = [pool.submit(timed, host, router_mode="heavy", max_tokens=8) for _ in range(2)]
        time.sleep(1.0)  # both admitted, both waiting on the stuck heavy stub
        assert not any(job.done() for job in jobs), [job.result() for job in jobs if job.done()]
        refused, _ = timed(host, router_mode="light", max_tokens=4)  # every place is taken now
        assert isinstance(refused, GenerationError) and "max_live_requests=2" in str(refused), refused
        failures = [job.result() for job in jobs]
        for error, took in failures:
            assert isinstance(error, GenerationError) and "heavy branch" in str(error), error
            assert took < DEADLINE_S + baseline_s + SLOW_MARGIN_S, (took, error)
        # the places are free again while heavy is still stuck: a light request is admitted
        served, _ = timed(host, router_mode="light", max_tokens=4)
        assert not isinstance(served, Exception), served
        assert served.stats["generated_tokens"] == 4
    # going on: the late steps ran, their sessions were released after them, heavy serves again
    again, _ = timed(host, router_mode="heavy", max_tokens=8)
    assert not isinstance(again, Exception), again
    assert again.text == ok.text
    deadline = time.monotonic() + 30
    while live_sessions(server, "heavy") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_sessions(server, "heavy") == 0 and live_sessions(server, "light") == 0
    print(f"stuck-stub failures after {[round(t, 2) for _, t in failures]} s "
          f"(branch_timeout_s {BRANCH_TIMEOUT_S:g} + slack {DEADLINE_SLACK_S:g}; idle answer {baseline_s:.2f} s)")


async def _router_stream(grpc_url: str, cancel: asyncio.Event) -> str:
    """A heavy request on the router model's own gRPC stream, cancelled when ``cancel`` is set."""
    import tritonclient.grpc.aio as grpcclient

    from tokenrouter_backend.openai_front.triton_stream import generate

    async with grpcclient.InferenceServerClient(grpc_url) as client:
        async def consume():
            async for _ in generate(client, PROMPT, False, {"router_mode": "heavy", "max_tokens": 4}, "queued", 120):
                pass

        task = asyncio.ensure_future(consume())
        waiting = asyncio.ensure_future(cancel.wait())
        done, _ = await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            waiting.cancel()
            return f"ended before the cancel: {task.exception()!r}"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return "cancelled"


def test_a_request_cancelled_while_queued_gives_its_place_back_at_once(tiny_repository, tmp_path, start_triton):
    queue_timeout_s = 60.0
    repo = _repository(tiny_repository, tmp_path / "repo", branch_timeout_s=120, max_live_requests=1,
                       max_queued_requests=1, queue_timeout_s=queue_timeout_s)
    server = start_triton(repo)
    host = server.http_url.removeprefix("http://")
    loop = asyncio.new_event_loop()
    cancel = asyncio.Event()
    with cf.ThreadPoolExecutor(4) as pool, stuck(repo, "light"):
        holder = pool.submit(timed, host, router_mode="light", max_tokens=4)  # the one live place, stuck
        time.sleep(1.0)
        queued = pool.submit(loop.run_until_complete, _router_stream(server.grpc_url, cancel))
        time.sleep(1.0)
        full, _ = timed(host, router_mode="heavy", max_tokens=4)  # the queue's one place is taken
        assert isinstance(full, GenerationError) and "max_queued_requests=1" in str(full), full
        t0 = time.monotonic()
        loop.call_soon_threadsafe(cancel.set)
        assert queued.result(timeout=30) == "cancelled"
        released_s = None
        while time.monotonic() - t0 < queue_timeout_s / 2:
            probe = pool.submit(timed, host, router_mode="heavy", max_tokens=4)
            try:
                answer, _ = probe.result(timeout=1.0)
            except cf.TimeoutError:  # queued, not refused: the cancelled request's place was free
                released_s = time.monotonic() - t0 - 1.0
                break
            assert isinstance(answer, GenerationError) and "max_queued_requests=1" in str(answer), answer
        assert released_s is not None, "the cancelled request kept its queue place"
    loop.close()
    assert not isinstance(probe.result(timeout=60)[0], Exception)  # light going on: the queued probe ran
    assert not isinstance(holder.result(timeout=60)[0], Exception)
    assert released_s < queue_timeout_s / 6, released_s
    print(f"cancelled-while-queued: place free {max(released_s, 0):.2f} s after the cancel "
          f"(queue_timeout_s {queue_timeout_s:g})")
