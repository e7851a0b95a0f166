"""`tokenrouter` command: lazy subcommands; `serve` end to end (ready, SIGTERM, failing model,
restarts off). Restarts: tests/test_serve_restart.py."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from support.serve_process import SERVE_TIMEOUT_S, serve_args, server_pids, tokenrouter
from support.triton_repo import ADD_ONE_MODEL, write_failing_model, write_python_model
from tokenrouter_backend.cli import main as cli


def _get(url: str, headers: dict | None = None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_unavailable_subcommand_fails_alone(monkeypatch, capsys):
    monkeypatch.setattr(cli, "SUBCOMMANDS", cli.SUBCOMMANDS + (
        cli.Subcommand("ghost", "tokenrouter_backend.no_such_module", "missing"),))
    assert cli.main(["ghost", "--its-own-option", "x"]) == cli.EXIT_USAGE
    assert "tokenrouter_backend.no_such_module" in capsys.readouterr().err


def test_help_imports_no_subcommand_module():
    _, loaded = cli.build_parser(selected=None)
    assert loaded == {}


@pytest.mark.triton
def test_serve_prints_endpoints_and_stops_on_sigterm(tmp_path):
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    proc = tokenrouter(*serve_args(repo, tmp_path), data_dir=tmp_path / "data")
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  admin APIs"):
                break
        text = "".join(lines)
        assert "ready" in text, text + proc.stderr.read()
        key_file = tmp_path / "data" / "admin.key"
        assert f"need the header tokenrouter-admin-key: <the key in {key_file}>" in text, text
        assert (key_file.stat().st_mode & 0o777) == 0o600
        key = key_file.read_text().strip()
        assert key not in text and len(key) >= 40
        http = re.search(r"HTTP +(http://\S+)", text).group(1)
        assert _get(f"{http}/v2/models/add_one/config") == 403
        assert _get(f"{http}/v2/models/add_one/config", {"tokenrouter-admin-key": key}) == 200
        assert re.search(r"HTTP +http://127\.0\.0\.1:\d+", text)
        assert re.search(r"gRPC +127\.0\.0\.1:\d+", text)
        assert len(server_pids(repo)) >= 2, "expected tritonserver and a stub running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=SERVE_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert server_pids(repo) == []


@pytest.mark.triton
def test_killed_serve_leaves_no_server(tmp_path):
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    proc = tokenrouter(*serve_args(repo, tmp_path), data_dir=tmp_path / "data")
    try:
        assert any(line.startswith("ready") for line in proc.stdout), proc.stderr.read()
        assert server_pids(repo)
    finally:
        proc.kill()  # SIGKILL: serve cannot clean up; the server must notice by itself
        proc.wait()
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while server_pids(repo) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server_pids(repo) == []


@pytest.mark.triton
def test_serve_with_restarts_off_stops_when_a_stub_dies(tmp_path):
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    proc = tokenrouter(*serve_args(repo, tmp_path), "--restarts", "0", data_dir=tmp_path / "data")
    try:
        assert any(line.startswith("ready") for line in proc.stdout), proc.stderr.read()
        stub = next(pid for pid in server_pids(repo)
                    if Path(f"/proc/{pid}/cmdline").read_bytes().find(b"/add_one/1/model.py") >= 0)
        os.kill(stub, signal.SIGKILL)  # as the kernel's OOM killer would
        _, err = proc.communicate(timeout=SERVE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and f"Python stub died: model 'add_one' (pid {stub})" in err, err
    assert "restarts are off (--restarts 0)" in err, err
    assert server_pids(repo) == []


@pytest.mark.triton
def test_serve_exits_nonzero_with_the_failing_models_error(tmp_path):
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    write_failing_model(repo, "broken", "tokenizer file missing")
    proc = tokenrouter(*serve_args(repo, tmp_path), data_dir=tmp_path / "data")
    try:
        _, err = proc.communicate(timeout=SERVE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "'broken'" in err and "tokenizer file missing" in err
    assert server_pids(repo) == []


def test_serve_refuses_a_missing_repository(tmp_path):
    proc = tokenrouter("serve", "--repository", str(tmp_path / "nope"), data_dir=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "model repository not found" in err


@pytest.mark.triton
def test_serve_openai_port_starts_the_front_and_stops_it(tmp_path):
    import json
    import urllib.error
    import urllib.request

    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    proc = tokenrouter(*serve_args(repo, tmp_path), "--openai-port", "0", data_dir=tmp_path / "data")
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  OpenAI"):
                break
        text = "".join(lines)
        found = re.search(r"OpenAI +(http://127\.0\.0\.1:\d+/v1)", text)
        assert found, text + proc.stderr.read()
        with urllib.request.urlopen(f"{found.group(1)}/models", timeout=30) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["tokenrouter"]
        with urllib.request.urlopen(found.group(1).removesuffix("/v1") + "/health", timeout=30) as r:
            assert r.status == 200
        chat = urllib.request.Request(f"{found.group(1)}/chat/completions", method="POST", data=json.dumps(
            {"model": "tokenrouter", "messages": [{"role": "user", "content": "hi"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as info:  # this repository has no tokenizer
            urllib.request.urlopen(chat, timeout=30)
        assert info.value.code == 400 and json.loads(info.value.read())["error"]["code"] == "chat_template_missing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=SERVE_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert server_pids(repo) == []


def test_serve_heavy_url_refuses_a_bad_entry_naming_the_field(tmp_path, capsys):
    assert cli.main(["serve", "--repository", str(tmp_path), "--heavy-url", "a:1", "--heavy-url", "b"]) == 2
    err = capsys.readouterr().err
    assert "heavy_url" in err and "'b'" in err and "1..65535" in err


def test_serve_heavy_url_list_reaches_the_router_environment(tmp_path, monkeypatch):
    from tokenrouter_backend.branches.remote import HEAVY_URL_ENV

    monkeypatch.delenv(HEAVY_URL_ENV, raising=False)
    monkeypatch.setenv(HEAVY_URL_ENV, "")  # restored by monkeypatch after serve sets it
    with pytest.raises(AssertionError, match="starts a tritonserver"):  # the unmarked test's start() refuses
        cli.main(["serve", "--repository", str(tmp_path), "--admin-key-file", str(tmp_path / "admin.key"),
                  "--heavy-url", "h0:8001, h1:8001", "--heavy-url", "h2:8001"])
    assert os.environ[HEAVY_URL_ENV] == "h0:8001,h1:8001,h2:8001"


@pytest.mark.parametrize("flag, value, allowed", [("--restarts", "-1", ">= 0"),
                                                  ("--restart-window-s", "0", "> 0"),
                                                  ("--restart-backoff-s", "31", "[0, 30]")])
def test_serve_refuses_a_bad_restart_policy_naming_the_flag(tmp_path, capsys, flag, value, allowed):
    assert cli.main(["serve", "--repository", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and allowed in err, err
