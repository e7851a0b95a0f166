"""Fault injection: a branch model's Python stub killed mid-request (real tritonserver).

The request in flight must fail with an error naming the branch, within a bound (no hang).
Afterwards the server must serve again or report itself unready: Triton 2.51 keeps
answering ready while the branch fails every request, so the launcher's readiness
(``TritonServer.is_ready``) also checks that every stub it saw at readiness still runs, and
``tokenrouter serve`` restarts the server when one died (tests/test_serve_restart.py). These
tests start tritonserver directly, without serve's restart policy.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import time

import pytest

from tokenrouter_backend.client.triton_client import GenerationError, generate_http

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

ANSWER_BOUND_S = 60.0
RECOVERY_BOUND_S = 20.0
UNREADY_POLLS = 6  # readiness and a request, every 0.5 s: unready this often in a row is "reports unready"
PROMPT = "def f(x):\n    "


def stub_pid(server, model: str) -> int:
    """The Python-backend stub process serving ``model`` (its argv names the model's path)."""
    from tokenrouter_backend.server.pids import stub_model

    for pid in server.group_pids():
        if stub_model(pid) == model:
            return pid
    raise AssertionError(f"no stub process for {model} among {server.group_pids()}")


def kill_stub_mid_request(server, model: str) -> tuple[Exception, float]:
    """Kill ``model``'s stub while a long streamed request runs on it; (its error, seconds to fail).

    The error is a ``GenerationError`` when the server answered with one, an ``OSError``
    when the connection dropped without an answer (the server going down).

    The kill waits for the stream's first tokens, so the request is generating on the branch
    when its stub dies (a fixed sleep raced the tiny light model, which writes 900 tokens in
    about a second).
    """
    host = server.http_url.removeprefix("http://")
    victim = stub_pid(server, model)
    streaming = threading.Event()
    with cf.ThreadPoolExecutor(1) as pool:
        job = pool.submit(generate_http, host, PROMPT, stream=True, max_tokens=900, router_mode=model,
                          timeout_s=ANSWER_BOUND_S, on_chunk=lambda _text: streaming.set())
        job.add_done_callback(lambda _job: streaming.set())
        first = streaming.wait(ANSWER_BOUND_S)
        assert first and not job.done(), "the request ended before it streamed: make it longer"
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        with pytest.raises((GenerationError, OSError)) as err:  # OSError: the server itself went away
            result = job.result(timeout=ANSWER_BOUND_S)
            pytest.fail(f"the request finished ({result.tokens} tokens) although its {model} stub was killed")
        return err.value, time.monotonic() - t0


# tritonserver 2.51's Python backend, when a stub dies while it holds their shared-memory
# mutex, may abort the whole server: "terminate called after throwing an instance of
# 'boost::interprocess::lock_exception'", signal 6 (seen in a fraction of runs of these
# tests; the kernel's OOM killer hit it the same way). docs/security.md, "Known limits".
TRITON_STUB_ABORT = "boost::interprocess::lock_exception"


def aborted_on_the_stub_mutex(server, error: Exception | None = None) -> bool:
    """The server died of the Python backend's mutex abort (and of nothing else).

    A request whose connection the server dropped (no answer at all: "Connection aborted",
    "Response ended prematurely", ...) means the server is going down: give it a few seconds
    to exit before asking. A server still running after that is not excused.
    """
    if isinstance(error, OSError):
        deadline = time.monotonic() + 10
        while server.is_running() and time.monotonic() < deadline:
            time.sleep(0.1)
    if server.is_running():
        return False
    assert TRITON_STUB_ABORT in server.log_text(), "tritonserver died, and not of the known stub-mutex abort"
    return True


KILL_ATTEMPTS = 3  # fresh servers tried when 2.51 aborts on the stub mutex (no answer to check)


@pytest.mark.parametrize("model", ["heavy", "light"])
def test_killed_branch_stub_fails_the_request_by_name(tiny_repository, start_triton, model):
    """The answer must name the branch. A dropped connection (no answer) is excused only by
    the known abort, and then a fresh server is tried: the test passes only on an answer."""
    for _ in range(KILL_ATTEMPTS):
        server = start_triton(tiny_repository)
        error, took = kill_stub_mid_request(server, model)
        assert took < ANSWER_BOUND_S
        if isinstance(error, GenerationError):
            assert f"{model} branch" in str(error), repr(error)
            assert server.is_running() or aborted_on_the_stub_mutex(server)
            return
        assert aborted_on_the_stub_mutex(server, error), repr(error)  # no answer: only the known abort excuses it
        server.stop()
    pytest.fail(f"tritonserver aborted on the stub mutex in all {KILL_ATTEMPTS} attempts: "
                "the request's error was never seen with the server alive")


def test_server_recovers_or_reports_unready_after_a_stub_kill(tiny_repository, start_triton):
    """Never "ready" while failing: each poll reads the launcher's readiness, then sends a
    request; a request that fails while the server said ready fails the test. Polling goes on
    until the server serves again or has said unready over several polls (Triton 2.51's own
    /v2/health/ready keeps answering 200 after the kill: a readiness that trusted it alone
    would fail here)."""
    server = start_triton(tiny_repository)
    kill_stub_mid_request(server, "heavy")
    host = server.http_url.removeprefix("http://")
    unready_polls, deadline = 0, time.monotonic() + RECOVERY_BOUND_S
    while time.monotonic() < deadline:
        ready = server.is_ready()
        try:
            served = generate_http(host, "import os\n", max_tokens=4, router_mode="heavy", timeout_s=10).tokens == 4
        except (GenerationError, OSError):  # refused / dropped connections count as not serving
            served = False
        if served:
            return
        assert not ready, "the server said ready, then failed a request: its readiness missed the dead stub"
        unready_polls += 1
        if unready_polls >= UNREADY_POLLS:
            return
        time.sleep(0.5)
    pytest.fail(f"within {RECOVERY_BOUND_S:.0f} s the server neither served again nor stayed unready")
