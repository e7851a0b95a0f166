"""`tokenrouter serve` restarts its tritonserver (real server, tiny pair).

tritonserver SIGKILLed, then the heavy model's Python stub SIGKILLed (as the OOM killer
would): each time serve stops what is left, removes the dead server's shared memory and
starts a fresh tritonserver on the same ports, which answers the same request with the same
text. Over ``--restarts`` serve exits non-zero naming the limit. Nothing is left behind.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from test_faults import TRITON_STUB_ABORT

from support.serve_process import SERVE_TIMEOUT_S, ServeLines, children, serve_args, server_pids, stub_pid, tokenrouter
from tokenrouter_backend.client.triton_client import generate_http
from tokenrouter_backend.server.pids import server_stubs
from tokenrouter_backend.server.probe import http_status

pytestmark = pytest.mark.triton  # every test here starts tokenrouter serve

RESTART_BOUND_S = 120.0  # stop + backoff + loading the tiny pair again; only bounds a hang
FRONT_BOUND_S = 2.0      # the OpenAI front's gRPC channel reconnects within this after a restart
PROMPT = "def add(a, b):\n    "
KNOBS = {"max_tokens": 8, "temperature": 0.0, "router_mode": "verify"}


def tritonserver_pid(serve: subprocess.Popen) -> int:
    found = [pid for pid in children(serve.pid)
             if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"]
    assert len(found) == 1, f"expected one tritonserver child of serve, got {found}"
    return found[0]


def shm_prefixes(serve: subprocess.Popen) -> set[str]:
    """The Python-backend shared-memory prefixes of serve's servers (tokenrouter_<pid>_<id>_)."""
    return {"_".join(p.name.split("_")[:3]) for p in Path("/dev/shm").glob(f"tokenrouter_{serve.pid}_*")}


@pytest.fixture
def start_serve(tiny_repository, tmp_path):
    """Start serve on the tiny pair; always stopped (SIGTERM, then SIGKILL) and checked gone."""
    started: list[subprocess.Popen] = []

    def start(*extra: str) -> tuple[subprocess.Popen, ServeLines, str]:
        proc = tokenrouter(*serve_args(tiny_repository, tmp_path), "--restart-backoff-s", "0.5", *extra,
                           data_dir=tmp_path / "data")
        started.append(proc)
        lines = ServeLines(proc)
        host = lines.wait_for(r"HTTP +http://(\S+)").group(1)
        lines.wait_for(r"^  admin APIs")
        return proc, lines, host

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=SERVE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    deadline = time.monotonic() + 30
    while server_pids(tiny_repository) and time.monotonic() < deadline:  # PDEATHSIG after a kill
        time.sleep(0.5)
    assert server_pids(tiny_repository) == [], "a tritonserver or stub outlived serve"
    assert not [p for proc in started for p in Path("/dev/shm").glob(f"tokenrouter_{proc.pid}_*")]


def restarted(lines: ServeLines, host: str, k: int, limit: int) -> None:
    """serve reports the k-th restart and the server answers ready on the same HTTP port."""
    lines.wait_for(rf"restarted \({k} of {limit} in the window\); ready again on HTTP http://{host}",
                   RESTART_BOUND_S)
    assert http_status(f"http://{host}/v2/health/ready", 5) == 200


def front_completion(front: str) -> str:
    """The OpenAI front's greedy completion of PROMPT."""
    resp = requests.post(f"{front}/completions", timeout=60, json={
        "model": "tokenrouter", "prompt": PROMPT, "max_tokens": KNOBS["max_tokens"], "temperature": 0,
        "router_mode": KNOBS["router_mode"]})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_serve_restarts_a_killed_server_and_a_killed_stub_on_the_same_ports(start_serve):
    proc, lines, host = start_serve("--restarts", "2")
    expected = generate_http(host, PROMPT, timeout_s=60, **KNOBS).text
    first_server, first_shm = tritonserver_pid(proc), shm_prefixes(proc)
    assert len(first_shm) == 1

    os.kill(first_server, signal.SIGKILL)
    restarted(lines, host, 1, 2)
    assert "tritonserver exited: signal 9 (SIGKILL)" in lines.errors
    second_server = tritonserver_pid(proc)
    assert second_server != first_server
    assert len(shm_prefixes(proc)) == 1 and shm_prefixes(proc) != first_shm, "the dead server's regions stayed"
    assert generate_http(host, PROMPT, timeout_s=60, **KNOBS).text == expected

    heavy, before = stub_pid(second_server, "heavy"), len(lines.errors)
    os.kill(heavy, signal.SIGKILL)
    restarted(lines, host, 2, 2)
    cause = lines.errors[before:]
    assert f"Python stub died: model 'heavy' (pid {heavy})" in cause \
        or ("tritonserver exited" in cause and TRITON_STUB_ABORT in cause), cause  # 2.51's abort, see test_faults
    assert tritonserver_pid(proc) != second_server
    assert generate_http(host, PROMPT, timeout_s=60, **KNOBS).text == expected
    assert proc.poll() is None


def poll_until(url: str, done: threading.Event) -> None:
    """GET ``url`` every 0.5 s until ``done``, as a load balancer's health check does."""
    while not done.wait(0.5):
        requests.get(url, timeout=10)


def test_the_openai_front_answers_soon_after_a_long_restart(start_serve):
    """30 s down while a load balancer polls the front's /health: with gRPC's default
    reconnect backoff the front's channel would wait ~17 s between attempts by then."""
    proc, lines, host = start_serve("--openai-port", "0", "--restart-backoff-s", "30")
    front = re.search(r"OpenAI +(http://\S+)", lines.text).group(1)
    health = f"{front.removesuffix('/v1')}/health"
    expected = front_completion(front)
    os.kill(tritonserver_pid(proc), signal.SIGKILL)
    restart_done = threading.Event()
    poller = threading.Thread(target=poll_until, args=(health, restart_done), daemon=True)
    poller.start()
    try:
        restarted(lines, host, 1, 3)
    finally:
        restart_done.set()
        poller.join()
    ready_again = time.monotonic()
    while requests.get(health, timeout=10).status_code != 200:
        assert time.monotonic() - ready_again < FRONT_BOUND_S, "the OpenAI front still cannot reach Triton"
        time.sleep(0.1)
    assert front_completion(front) == expected


def test_serve_over_its_restart_limit_exits_nonzero_naming_it(start_serve):
    proc, lines, host = start_serve("--restarts", "1")
    os.kill(tritonserver_pid(proc), signal.SIGKILL)
    restarted(lines, host, 1, 1)
    os.kill(stub_pid(tritonserver_pid(proc), "heavy"), signal.SIGKILL)
    assert proc.wait(timeout=RESTART_BOUND_S) == 1
    time.sleep(0.5)  # the stderr pump reads the last lines
    assert "restart limit reached: 1 restarts in the last 600 s (limit --restarts 1 within " \
           "--restart-window-s 600)" in lines.errors, lines.errors


def test_sigterm_during_the_backoff_stops_serve_cleanly(start_serve):
    proc, lines, host = start_serve("--restart-backoff-s", "30")
    os.kill(tritonserver_pid(proc), signal.SIGKILL)
    lines.wait_for(r"restarting tritonserver in 30 s \(restart 1 of 3 in 600 s\)", RESTART_BOUND_S)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0  # not after the 30 s backoff
    assert http_status(f"http://{host}/v2/health/ready", 2) is None  # the fixture checks no process is left


def test_admin_reloads_are_not_stub_deaths_but_a_killed_stub_still_is(start_serve, tiny_repository, tmp_path):
    """Explicit model control: five reloads of heavy with the admin key (each after its files
    changed, so Triton does replace its instance) leave the same tritonserver serving; serve
    follows the new stub, so a later kill of it is still a death that restarts the server."""
    key_file = tmp_path / "admin.key"
    proc, lines, host = start_serve("--model-control-mode", "explicit", "--admin-key-file", str(key_file),
                                    "--restarts", "1")
    key = key_file.read_text().strip()
    expected = generate_http(host, PROMPT, timeout_s=60, **KNOBS).text
    server = tritonserver_pid(proc)

    def heavy_stub() -> int | None:  # the instance's stub (not the one a load runs for auto-complete)
        found = [pid for pid, model in server_stubs(server).items() if model == "heavy"]
        return found[0] if len(found) == 1 else None

    stubs = set()
    for _ in range(5):
        before = heavy_stub()
        stubs.add(before)
        (tiny_repository / "heavy" / "1" / "model.py").touch()  # Triton reloads only changed models
        try:
            resp = requests.post(f"http://{host}/v2/repository/models/heavy/load", data=b"{}", timeout=120,
                                 headers={"tokenrouter-admin-key": key})
        except requests.ConnectionError as exc:
            pytest.fail(f"the reload lost its connection ({exc}); serve said: {lines.errors}")
        assert resp.status_code == 200, resp.text
        deadline = time.monotonic() + 30
        while heavy_stub() in (before, None) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert heavy_stub() not in (before, None), "the reload did not replace heavy's stub"
        time.sleep(1.0)  # a few of the supervisor's polls
    assert len(stubs) == 5 and proc.poll() is None, lines.errors
    assert tritonserver_pid(proc) == server and "restart" not in lines.errors, lines.errors
    assert generate_http(host, PROMPT, timeout_s=60, **KNOBS).text == expected
    heavy = heavy_stub()  # the fifth reload's stub: a death all the same
    os.kill(heavy, signal.SIGKILL)
    restarted(lines, host, 1, 1)
    assert f"model 'heavy' (pid {heavy})" in lines.errors \
        or ("tritonserver exited" in lines.errors and TRITON_STUB_ABORT in lines.errors), lines.errors
    assert generate_http(host, PROMPT, timeout_s=60, **KNOBS).text == expected
