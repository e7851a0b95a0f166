"""The launcher runs the wheel's real tritonserver: ready, infers, stops clean, reports failures."""
from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support.triton_repo import ADD_ONE_MODEL, write_failing_model, write_python_model
from tokenrouter_backend.server.errors import TritonServerError
from tokenrouter_backend.server.install import TritonInstall, server_environment
from tokenrouter_backend.server.logs import parse_model_errors
from tokenrouter_backend.server.process import TritonServer, process_group_pids


def _get_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status


def _infer_add_one(server: TritonServer, values: list[float]) -> dict:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)],
                                   "datatype": "FP32", "data": values}]}).encode()
    request = urllib.request.Request(f"{server.http_url}/v2/models/add_one/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return {o["name"]: o["data"] for o in json.load(resp)["outputs"]}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def add_one_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    return repo


@pytest.mark.triton
def test_serves_a_python_model_and_stops_clean(add_one_repo, start_triton):
    server = start_triton(add_one_repo)
    assert _get_status(f"{server.http_url}/v2/health/ready") == 200
    assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3
    outputs = _infer_add_one(server, [1.0, 2.5, -3.0])
    assert outputs["OUTPUT0"] == [2.0, 3.5, -2.0]
    import tokenrouter_backend
    assert outputs["PACKAGE"] == [tokenrouter_backend.__version__]  # model.py imported us

    pids = server.group_pids()
    assert len(pids) >= 2, f"expected server + Python stub, got {pids}"
    shm = Path("/dev/shm")
    assert list(shm.glob(server.shm_prefix + "*")), "the Python backend's shared memory has this server's prefix"
    os.kill(next(p for p in pids if p != server.pid), signal.SIGKILL)  # a stub killed hard never unlinks its region
    server.stop()
    assert not [pid for pid in pids if _alive(pid)], "processes survived stop()"
    assert not list(shm.glob(server.shm_prefix + "*")), "shared-memory regions leaked"
    assert not server.is_running()
    server.stop()  # idempotent


@pytest.mark.triton
def test_context_manager_and_metrics(add_one_repo, tmp_path):
    with TritonServer(add_one_repo, log_path=tmp_path / "cm.log", ready_timeout_s=120) as server:
        assert _get_status(server.metrics_url) == 200
        pids = server.group_pids()
    assert not [pid for pid in pids if _alive(pid)]


@pytest.mark.triton
def test_failing_model_is_reported_by_name_with_its_error(add_one_repo, tmp_path, start_triton):
    write_failing_model(add_one_repo, "broken", "deliberate failure: weights unreadable")
    with pytest.raises(TritonServerError) as info:
        start_triton(add_one_repo)
    err = info.value
    assert "broken" in err.model_errors
    assert "deliberate failure: weights unreadable" in err.model_errors["broken"]
    assert "add_one" not in err.model_errors
    assert "'broken'" in str(err) and "weights unreadable" in str(err)
    assert err.log_path is not None and err.log_path.is_file()


@pytest.mark.triton
def test_failed_start_leaves_no_process(add_one_repo, tmp_path):
    write_failing_model(add_one_repo, "broken", "boom")
    server = TritonServer(add_one_repo, log_path=tmp_path / "fail.log", ready_timeout_s=120)
    server.start()
    pgid = server.pid
    with pytest.raises(TritonServerError):
        server.wait_ready()
    assert not server.is_running()
    assert process_group_pids(pgid) == []


@pytest.mark.triton
def test_explicit_mode_reloads_a_model(add_one_repo, start_triton):
    server = start_triton(add_one_repo, model_control_mode="explicit")
    server.unload_model("add_one")
    assert _model_ready(server, "add_one") is False
    server.load_model("add_one")
    assert _infer_add_one(server, [0.0])["OUTPUT0"] == [1.0]


def _model_ready(server: TritonServer, name: str) -> bool:
    try:
        return _get_status(f"{server.http_url}/v2/models/{name}/ready") == 200
    except urllib.error.HTTPError:
        return False


@pytest.mark.triton  # calls start(): refused before a process exists
def test_missing_repository_is_refused(tmp_path):
    with pytest.raises(TritonServerError, match="model repository not found"):
        TritonServer(tmp_path / "nope").start()


def test_environment_puts_running_python_libdir_first():
    import sys
    import sysconfig
    env = server_environment(TritonInstall.find(), base={"LD_LIBRARY_PATH": "/x", "PATH": "/usr/bin"})
    libs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert libs[0] == sysconfig.get_config_var("LIBDIR")
    assert libs[1].endswith("nvidia_pytriton.libs") and libs[-1] == "/x"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_parse_model_errors_reads_lines_and_wrapped_table():
    log = "\n".join([
        'E1130 00:01:03.645651 7056 model_lifecycle.cc:642] "failed to load \'a\' version 1: '
        'Internal: RuntimeError: bad a\\n\\nAt:\\n  model.py(3): initialize\\n"',
        "+-------+---------+---------------------------+",
        "| Model | Version | Status                    |",
        "+-------+---------+---------------------------+",
        "| a     | 1       | UNAVAILABLE: Internal: x  |",
        "| b     | 1       | UNAVAILABLE: Invalid argu |",
        "|       |         | ment: no config           |",
        "| c     | 1       | READY                     |",
        "+-------+---------+---------------------------+",
    ])
    errors = parse_model_errors(log)
    assert errors["a"].startswith("Internal: RuntimeError: bad a\n\nAt:")
    assert errors["b"] == "Invalid argu ment: no config"
    assert "c" not in errors


class _Popen:
    """A stand-in for the server's process: running (code None) or exited."""

    pid = 2**22 + 1  # above the kernel's largest pid_max: no real process group

    def __init__(self, code: int | None):
        self.code = code

    def poll(self) -> int | None:
        return self.code


def test_ports_picked_at_the_first_start_are_kept_for_a_restart(tmp_path, monkeypatch):
    log = tmp_path / "t.log"
    server = TritonServer(tmp_path, log_path=log, ready_timeout_s=5)
    ports = (server.http_port, server.grpc_port, server.metrics_port)
    monkeypatch.setattr(server, "_http_status", lambda path: 200)
    monkeypatch.setattr(server, "stop", lambda: None)
    server._proc = _Popen(None)  # answers ready: clients now know these ports
    server.wait_ready()
    log.write_text("E1201 http_server.cc:4752] failed to start HTTP service: Address already in use\n")
    server._proc = _Popen(1)  # the restart found a port taken: it must fail, not move elsewhere
    with pytest.raises(TritonServerError, match="exited with code 1 before it was ready"):
        server.wait_ready()
    assert (server.http_port, server.grpc_port, server.metrics_port) == ports
