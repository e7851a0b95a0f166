"""The container stub watchdog (server/stub_watch.py) around the wheel's real tritonserver.

The command line is the one `TritonServer.start` runs (``launch_command``) on the tiny pair.
SIGKILL of the heavy model's stub (as the OOM killer would) makes the watchdog stop
tritonserver and exit 3 naming ``heavy``; SIGTERM to the watchdog stops tritonserver
gracefully; a SIGKILLed tritonserver ends it with 137; models unloaded, loaded and reloaded
over the API (explicit model control) are followed; docker/tritonserver.sh runs the
watchdog by default. Nothing is left behind, shared-memory regions included.
Without Triton: the argument parsing, and the adopt / unload / reload rules against a
stand-in server (tests/support/fake_tritonserver.py).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.serve_process import children, stub_pid
from tokenrouter_backend.server.pids import pid_alive, process_group_pids
from tokenrouter_backend.server.ports import free_ports
from tokenrouter_backend.server.process import TritonServer
from tokenrouter_backend.server.stub_watch import EXIT_STUB_LOST, exit_code
from tokenrouter_backend.server.stub_watch_args import TRITON_SHM_PREFIX, WatchOptions, parse_args

ROOT = Path(__file__).resolve().parents[1]
READY_BOUND_S = 120.0  # the tiny pair loads in seconds; this only bounds a hang
EXIT_BOUND_S = 20.0    # stub death -> watchdog gone (poll 0.5 s + Triton's graceful stop)
ADMIN_KEY = "stub-watch-test-key-0123"
READY_LINE = r"stub_watch: tritonserver ready; watching (\d+) Python stubs"


class Watched:
    """One watchdog process, its output in a file, and the pids it ran under it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        self.seen: set[int] = set()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = READY_BOUND_S) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text(), re.M)
            if found:
                return found
            assert self.proc.poll() is None, f"watchdog exited {self.proc.returncode}:\n{self.text()[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout_s:.0f} s:\n{self.text()[-3000:]}")

    def server_pid(self, comm: str = "tritonserver") -> int:
        """The watchdog's child (``comm``), leader of its own process group; its group is tracked."""
        kids = children(self.proc.pid)
        servers = [p for p in kids if Path(f"/proc/{p}/comm").read_text().strip() == comm]
        assert len(servers) == 1, f"expected one {comm} under the watchdog, got {kids}"
        self.seen.update(process_group_pids(servers[0]))
        return servers[0]

    def track(self) -> None:
        """Remember every process of the watchdog's child's group (checked gone at the end)."""
        for kid in children(self.proc.pid):
            self.seen.update([kid, *children(kid), *process_group_pids(kid)])

    def wait_exit(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def cleanup(self) -> None:
        """Whatever happened: nothing of this run may survive the test."""
        if self.proc.poll() is None:
            self.track()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def survivors(self) -> list[int]:
        return sorted(pid for pid in self.seen if pid_alive(pid))


@pytest.fixture
def launch(tiny_repository, tmp_path):
    """(server, argv, env) of tritonserver on the tiny pair, as `TritonServer.start` runs it."""
    server = TritonServer(tiny_repository, log_path=tmp_path / "unused.log", restricted_apis=())
    argv, env = server.launch_command()
    return server, argv, {**env, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def watched(tmp_path):
    runs: list[Watched] = []

    def start(argv: list[str], env: dict[str, str]) -> Watched:
        run = Watched(argv, env, tmp_path / f"watch-{len(runs)}.log")
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.cleanup()


def watchdog_argv(server_argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "tokenrouter_backend.server.stub_watch", "--poll-s", "0.5", "--", *server_argv]


def shm_regions(prefix: str) -> list[Path]:
    return list(Path("/dev/shm").glob(prefix + "*"))


def kill_heavy_stub_and_expect_exit(run: Watched, server: TritonServer) -> None:
    heavy = [stub_pid(run.server_pid(), "heavy")]
    assert shm_regions(server.shm_prefix), "the Python backend's regions carry this server's prefix"
    os.kill(heavy[0], signal.SIGKILL)
    killed_at = time.monotonic()
    code = run.wait_exit(EXIT_BOUND_S)
    took = time.monotonic() - killed_at
    text = run.text()
    assert code == EXIT_STUB_LOST, f"exit {code} after {took:.1f} s:\n{text[-3000:]}"
    assert re.search(rf"stub_watch: Python stub died: model 'heavy' \(pid {heavy[0]}\)", text), text[-3000:]
    assert not run.survivors(), f"left running: {run.survivors()}"
    assert not shm_regions(server.shm_prefix), "the killed stub's shared-memory regions were left"


@pytest.mark.triton
def test_a_killed_heavy_stub_ends_the_watchdog_with_exit_3(launch, watched):
    server, argv, env = launch
    run = watched(watchdog_argv(argv), env)
    stubs = int(run.wait_for(READY_LINE).group(1))
    assert stubs == 5, run.text()[-2000:]  # preprocessing, router, heavy, light, postprocessing
    time.sleep(1.5)  # a few polls with every stub alive: no false alarm
    assert run.proc.poll() is None, run.text()[-3000:]
    kill_heavy_stub_and_expect_exit(run, server)


@pytest.mark.triton
def test_sigterm_to_the_watchdog_stops_tritonserver_gracefully(launch, watched):
    server, argv, env = launch
    run = watched(watchdog_argv(argv), env)
    run.wait_for(READY_LINE)
    run.server_pid()
    run.proc.send_signal(signal.SIGTERM)
    code = run.wait_exit(60)
    text = run.text()
    assert code == 0, f"exit {code}:\n{text[-3000:]}"  # Triton's own code after a graceful stop
    assert "stub_watch: SIGTERM: stopping tritonserver" in text
    assert "stub_watch: tritonserver stopped with code 0; exit 0" in text
    assert "SIGKILL" not in text and "stub died" not in text, text[-3000:]
    assert not run.survivors(), f"left running: {run.survivors()}"
    assert not shm_regions(server.shm_prefix)


@pytest.mark.triton
def test_a_killed_tritonserver_ends_the_watchdog_with_its_code_and_no_leftovers(launch, watched):
    server, argv, env = launch
    run = watched(watchdog_argv(argv), env)
    run.wait_for(READY_LINE)
    triton = run.server_pid()
    assert shm_regions(server.shm_prefix)
    os.kill(triton, signal.SIGKILL)  # as an abort would: nothing of Triton's own cleanup runs
    code = run.wait_exit(EXIT_BOUND_S)
    text = run.text()
    assert code == 128 + signal.SIGKILL, f"exit {code}:\n{text[-3000:]}"
    assert f"stub_watch: tritonserver was killed by SIGKILL; exit {128 + signal.SIGKILL}" in text
    assert not run.survivors(), f"left running: {run.survivors()}"  # its stubs went with the group
    assert not shm_regions(server.shm_prefix), "the dead server's shared-memory regions were left"


@pytest.mark.triton
def test_models_unloaded_loaded_and_reloaded_over_the_api_are_followed(tiny_repository, tmp_path, watched):
    """Explicit model control on the real server: an unloaded model's stub and a reloaded
    model's old stub do not count, a newly loaded model's stub is adopted and watched."""
    server = TritonServer(tiny_repository, log_path=tmp_path / "unused.log", model_control_mode="explicit",
                          admin_key=ADMIN_KEY)
    argv, env = server.launch_command()
    run = watched(watchdog_argv(argv), {**env, "PYTHONPATH": str(ROOT)})
    run.wait_for(READY_LINE)
    triton = run.server_pid()
    server.unload_model("light")
    run.wait_for(r"stub of model 'light' \(pid \d+\) gone with its model \(unloaded\)", 60)
    server.load_model("light")
    run.wait_for(r"adopted a new Python stub: model 'light'", 60)
    old_heavy = stub_pid(triton, "heavy")
    # Triton reloads a loaded model's instances only when its version files changed
    (tiny_repository / "heavy" / "1" / "model.py").touch()
    server.load_model("heavy")  # a reload: Triton replaces the loaded model's instance
    run.wait_for(rf"stub of model 'heavy' \(pid {old_heavy}\) replaced by a newer one \(reload\)", 60)
    time.sleep(1.5)
    assert run.proc.poll() is None, run.text()[-3000:]
    assert "stub died" not in run.text()
    # each load also ran a short-lived stub for the config's auto-complete: never adopted
    assert len(re.findall(r"adopted a new Python stub: model '(?:light|heavy)'", run.text())) == 2, run.text()[-3000:]
    run.track()
    light = stub_pid(triton, "light")
    os.kill(light, signal.SIGKILL)
    assert run.wait_exit(EXIT_BOUND_S) == EXIT_STUB_LOST, run.text()[-3000:]
    assert f"Python stub died: model 'light' (pid {light})" in run.text()
    assert not run.survivors(), f"left running: {run.survivors()}"


@pytest.mark.triton
def test_the_container_wrapper_runs_tritonserver_under_the_watchdog(launch, watched, tmp_path):
    server, argv, env = launch
    own_flags = {"--exit-on-error=true", "--strict-readiness=true"}  # the wrapper adds these itself
    assert own_flags <= set(argv)
    env = {**env, "TRITONSERVER": argv[0], "TOKENROUTER_STUB_WATCH": "1",
           "TOKENROUTER_STUB_WATCH_POLL_S": "0.5", "TOKENROUTER_ADMIN_KEY": ADMIN_KEY,
           "PYTHON": sys.executable, "TOKENROUTER_ADMIN_KEY_FILE": str(tmp_path / "admin.key")}
    env.pop("TOKENROUTER_RESTRICTED_APIS", None)
    run = watched(["bash", str(ROOT / "docker/tritonserver.sh"), *[a for a in argv[1:] if a not in own_flags]], env)
    run.wait_for(READY_LINE)
    cmdline = Path(f"/proc/{run.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"tokenrouter_backend.server.stub_watch" in cmdline  # bash exec'd the watchdog
    server_cmd = Path(f"/proc/{run.server_pid()}/cmdline").read_bytes().split(b"\0")
    assert f"--http-restricted-api=model-repository,model-config,logging,shared-memory,trace:" \
           f"tokenrouter-admin-key={ADMIN_KEY}".encode() in server_cmd  # the wrapper's flags reached it
    kill_heavy_stub_and_expect_exit(run, server)


# ---- without Triton ------------------------------------------------------------------------
def test_parse_args_reads_the_watchdog_options_and_tritonserver_flags():
    opts = parse_args(["--poll-s", "0.5", "--ready-timeout-s", "30", "--", "tritonserver",
                       "--http-port=9000", "--http-address", "10.1.2.3", "--exit-timeout-secs=5",
                       "--backend-config=python,shm-default-byte-size=1024",
                       "--backend-config=python,shm-region-prefix-name=mine_"])
    assert opts == WatchOptions(command=opts.command, poll_s=0.5, ready_timeout_s=30.0,
                                http_url="http://10.1.2.3:9000", exit_timeout_s=5, shm_prefix="mine_")
    assert opts.command[0] == "tritonserver" and len(opts.command) == 7
    defaults = parse_args(["--", "tritonserver", "--http-port", "8100", "--http-address=0.0.0.0"])
    assert (defaults.poll_s, defaults.ready_timeout_s, defaults.http_url, defaults.exit_timeout_s,
            defaults.shm_prefix) == (2.0, 0.0, "http://127.0.0.1:8100", 30, TRITON_SHM_PREFIX)
    assert parse_args(["--", "tritonserver"]).http_url == "http://127.0.0.1:8000"
    assert parse_args(["--", "t", "--http-port=1", "--http-port=2"]).http_url.endswith(":2")  # last wins
    assert parse_args(["--", "t", "--http-address=::"]).http_url == "http://[::1]:8000"


@pytest.mark.parametrize("argv, named", [
    (["tritonserver"], "after '--'"),
    (["--"], "no tritonserver command"),
    (["--poll-s", "0", "--", "t"], "--poll-s must be in (0, 60] seconds, got 0"),
    (["--poll-s", "61", "--", "t"], "--poll-s must be in (0, 60]"),
    (["--ready-timeout-s", "-1", "--", "t"], "--ready-timeout-s must be in [0, 86400]"),
    (["--poll-s", "x", "--", "t"], "--poll-s"),
    (["--", "t", "--http-port=0"], "--http-port must be an integer in [1, 65535], got '0'"),
    (["--", "t", "--http-port=http"], "--http-port must be an integer"),
    (["--", "t", "--exit-timeout-secs=-3"], "--exit-timeout-secs must be an integer >= 0"),
    (["--", "t", "--allow-http=false"], "--allow-http=false"),
])
def test_parse_args_refuses_bad_input_naming_the_flag(argv, named, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_exit_code_maps_signals_like_a_shell():
    assert [exit_code(c) for c in (0, 1, 3, -9, -15)] == [0, 1, 3, 137, 143]


def test_unloaded_and_reloaded_stubs_do_not_count_a_killed_one_does(watched, tmp_path):
    control = tmp_path / "control"
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_TRITON_CONTROL": str(control),
           "FAKE_TRITON_MODELS": "heavy,light,router"}
    fake = [sys.executable, str(ROOT / "tests/support/fake_tritonserver.py"), f"--http-port={port}"]
    run = watched([sys.executable, "-m", "tokenrouter_backend.server.stub_watch", "--poll-s", "0.2", "--", *fake], env)
    assert run.wait_for(READY_LINE, 30).group(1) == "3"
    run.track()

    def act(line: str, expect: str) -> None:
        with open(control, "a") as f:
            f.write(line + "\n")
        run.wait_for(expect, 10)
        run.track()

    act("unload light", r"stub of model 'light' \(pid \d+\) gone with its model \(unloaded\)")
    act("load light", r"adopted a new Python stub: model 'light'")
    act("reload heavy", r"stub of model 'heavy' \(pid \d+\) replaced by a newer one \(reload\)")
    time.sleep(1.0)
    assert run.proc.poll() is None, run.text()
    with open(control, "a") as f:
        f.write("kill light\n")
    assert run.wait_exit(15) == EXIT_STUB_LOST, run.text()
    assert re.search(r"Python stub died: model 'light' \(pid \d+\)", run.text()), run.text()
    assert "model 'heavy'" not in run.text().split("Python stub died")[1]
    assert not run.survivors(), run.survivors()
