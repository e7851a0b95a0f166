"""`Supervisor` (serve's restart policy) on a scripted stand-in for `TritonServer`: restarts,
the limit, the sliding window, the doubling backoff, a stop during the backoff."""
from __future__ import annotations

import threading

import pytest

from tokenrouter_backend.server.errors import TritonServerError
from tokenrouter_backend.server.supervisor import (
    BACKOFF_CAP_S,
    Cause,
    RestartPolicy,
    Supervisor,
    describe_exit,
)

POLL_S = 0.125  # no backoff in these tests is this long
DEFAULT_POLICY = RestartPolicy()  # 3 restarts in 600 s, backoff 1 s


class FakeServer:
    """Dies at the scripted poll times (clock seconds): ("exit", code) or ("stub", pid)."""

    http_url, grpc_url = "http://127.0.0.1:18000", "127.0.0.1:18001"

    def __init__(self, clock, deaths, failing_starts=0):
        self.clock, self.deaths, self.failing_starts = clock, list(deaths), failing_starts
        self.running, self.lost, self.code = True, [], None
        self.starts, self.stops, self.serving_at_start = 0, 0, []
        self.serving: threading.Event | None = None

    def tick(self):
        if self.deaths and self.clock.now >= self.deaths[0][0] and self.running and not self.lost:
            _, kind, value = self.deaths.pop(0)
            if kind == "exit":
                self.running, self.code = False, value
            else:
                self.lost = [value]

    def lost_stubs(self):
        self.tick()
        return list(self.lost)

    def stub_names(self):
        return {pid: "heavy" for pid in self.lost}

    def is_running(self):
        self.tick()
        return self.running

    def stop(self):
        self.stops += 1
        self.running, self.lost = False, []
        return self.code

    def log_text(self):
        return "I1201 model loaded\nSignal (6) received."

    def start(self):
        self.starts += 1
        self.serving_at_start.append(self.serving.is_set())
        self.running, self.code = True, None

    def wait_ready(self):
        if self.failing_starts:
            self.failing_starts -= 1
            self.running = False
            raise TritonServerError("tritonserver exited with code 1 before it was ready")


class Clock:
    def __init__(self, stop_at: float = 10_000.0):
        self.now, self.stop_at, self.waits = 0.0, stop_at, []
        self.stop = threading.Event()
        self.stop_on_backoff = False

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        if seconds != POLL_S:
            self.waits.append(seconds)
            if self.stop_on_backoff:
                self.stop.set()
        self.now += seconds
        if self.now >= self.stop_at:
            self.stop.set()
        return self.stop.is_set()


def supervise(deaths, policy=DEFAULT_POLICY, *, stop_at=10_000.0, failing_starts=0, stop_on_backoff=False,
              other_failure=lambda: None):
    clock = Clock(stop_at)
    clock.stop_on_backoff = stop_on_backoff
    server = FakeServer(clock, [(t, *d) for t, *d in deaths], failing_starts)
    said, warned = [], []
    supervisor = Supervisor(server, policy, clock.stop, clock=clock, wait=clock.wait, poll_s=POLL_S,
                            say=said.append, warn=warned.append)
    server.serving = supervisor.serving
    code = supervisor.watch(other_failure)
    return code, server, clock, "\n".join(said), "\n".join(warned)


def test_a_dead_server_is_stopped_and_started_again_then_stop_ends_with_zero():
    code, server, clock, said, warned = supervise([(5, "exit", -9)])
    assert code == 0
    assert server.starts == 1 and server.stops >= 1
    assert "tritonserver exited: signal 9 (SIGKILL)" in warned and "Signal (6) received." in warned
    assert "restarted (1 of 3 in the window)" in said and server.http_url in said
    assert clock.waits == [1.0]


def test_a_dead_stub_is_named_and_restarted():
    code, server, _, said, warned = supervise([(3, "stub", 4242)])
    assert code == 0 and server.starts == 1
    assert "Python stub died: model 'heavy' (pid 4242)" in warned
    assert "restarted (1 of 3 in the window)" in said


def test_over_the_limit_exits_nonzero_naming_the_flags():
    code, server, _, said, warned = supervise([(t, "exit", 1) for t in (10, 20, 30, 40)])
    assert code == 1
    assert server.starts == 3
    assert "restarted (3 of 3 in the window)" in said
    assert "restart limit reached: 3 restarts in the last 600 s (limit --restarts 3 within " \
           "--restart-window-s 600)" in warned


def test_the_window_slides():
    policy = RestartPolicy(max_restarts=2, window_s=600)
    # 10 and 100 fill the window; at 650 the restart at 10 has left it; at 690 those at 100 and
    # 650 are in it
    code, server, _, said, warned = supervise([(t, "exit", 1) for t in (10, 100, 650, 690)], policy)
    assert code == 1 and server.starts == 3
    assert "restarted (2 of 2 in the window)" in said and "restart limit reached: 2 restarts" in warned
    spaced = [(t, "exit", 1) for t in range(10, 5000, 700)]  # never two within 600 s
    code, server, _, said, _ = supervise(spaced, policy, stop_at=6000)
    assert code == 0 and server.starts == len(spaced)
    assert "2 of 2" not in said


def test_backoff_doubles_per_restart_in_the_window_and_is_capped():
    policy = RestartPolicy(max_restarts=5, window_s=10_000, backoff_s=10)
    code, _, clock, _, _ = supervise([(t, "exit", 1) for t in (100, 200, 300, 400)], policy)
    assert code == 0
    assert clock.waits == [10, 20, BACKOFF_CAP_S, BACKOFF_CAP_S]
    assert [policy.backoff(k) for k in (1, 2, 3)] == [10, 20, 30]


def test_stop_during_the_backoff_ends_cleanly_without_a_start():
    code, server, clock, said, _ = supervise([(5, "exit", 1)], stop_on_backoff=True)
    assert code == 0 and server.starts == 0 and clock.waits == [1.0]
    assert "restarted" not in said


def test_zero_restarts_keeps_the_old_exit():
    code, server, _, _, warned = supervise([(5, "stub", 7)], RestartPolicy(max_restarts=0))
    assert code == 1 and server.starts == 0 and server.stops >= 1
    assert "model 'heavy' (pid 7)" in warned and "restarts are off (--restarts 0)" in warned


def test_a_failed_restart_counts_and_is_retried():
    code, server, clock, said, warned = supervise([(5, "exit", 1)], RestartPolicy(max_restarts=2),
                                                  failing_starts=1)
    assert code == 0 and server.starts == 2
    assert Cause.RESTART_FAILED.value in warned and "exited with code 1 before it was ready" in warned
    assert "restarted (2 of 2 in the window)" in said and clock.waits == [1.0, 2.0]


def test_serving_is_cleared_while_the_restarted_server_loads():
    code, server, _, _, _ = supervise([(5, "exit", 1)])
    assert code == 0 and server.serving_at_start == [False] and server.serving.is_set()


def test_another_failure_stops_with_its_message():
    code, server, _, _, warned = supervise([], other_failure=lambda: "the OpenAI front stopped; stopping")
    assert code == 1 and server.starts == 0 and "the OpenAI front stopped" in warned


@pytest.mark.parametrize("kwargs, field", [
    ({"max_restarts": -1}, "--restarts"), ({"max_restarts": 1.5}, "--restarts"),
    ({"window_s": 0}, "--restart-window-s"), ({"window_s": float("nan")}, "--restart-window-s"),
    ({"backoff_s": -1}, "--restart-backoff-s"), ({"backoff_s": BACKOFF_CAP_S + 1}, "--restart-backoff-s"),
])
def test_bad_policy_values_are_refused_naming_the_flag_and_range(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        RestartPolicy(**kwargs)
    assert ">" in str(err.value) or "[" in str(err.value)


def test_exit_codes_and_signals_are_described():
    assert describe_exit(-9) == "signal 9 (SIGKILL)"
    assert describe_exit(-6) == "signal 6 (SIGABRT)"
    assert describe_exit(1) == "code 1" and describe_exit(None) == "exit code unknown"
