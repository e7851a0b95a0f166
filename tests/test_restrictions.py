"""Triton's admin APIs are closed without the admin header; inference and health stay open."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support.triton_repo import ADD_ONE_MODEL, write_python_model
from tokenrouter_backend.server.process import TritonServer
from tokenrouter_backend.server.restrictions import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    RESTRICTED_APIS,
    Restriction,
)

KEY = "admin-key-for-tests-0123456789"


def test_flags_and_defaults():
    r = Restriction.create(key=KEY)
    assert r.apis == RESTRICTED_APIS
    value = f"model-repository,model-config,logging,shared-memory,trace:{ADMIN_HEADER}={KEY}"
    assert r.flags() == [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]
    assert Restriction.create((), key=KEY).flags() == []
    assert Restriction.create(environ={ADMIN_KEY_ENV: KEY}).key == KEY
    generated = Restriction.create(environ={})
    assert len(generated.key) >= 40 and generated.key != Restriction.create(environ={}).key
    with pytest.raises(ValueError, match="unknown API"):
        Restriction.create(("models",), key=KEY)
    for bad in ("short", "has:colon-and-long-enough", "has,comma-and-long-enough"):
        with pytest.raises(ValueError, match="at least 16 characters and none of"):
            Restriction.create(key=bad)


def test_server_command_carries_restriction_and_strict_flags(tmp_path):
    server = TritonServer(tmp_path, admin_key=KEY)
    from tokenrouter_backend.server.install import TritonInstall

    cmd = server.command(tmp_path, TritonInstall.find())
    assert "--exit-on-error=true" in cmd and "--strict-readiness=true" in cmd
    assert any(a.startswith("--http-restricted-api=model-repository,") for a in cmd)
    assert any(a.startswith("--grpc-restricted-protocol=model-repository,") for a in cmd)
    assert "--model-control-mode=none" in cmd
    assert server.admin_headers == {ADMIN_HEADER: KEY}
    opened = TritonServer(tmp_path, restricted_apis=())
    assert not any("restricted" in a for a in opened.command(tmp_path, TritonInstall.find()))


def test_explicit_model_control_requires_the_repository_restriction(tmp_path):
    with pytest.raises(ValueError, match="needs 'model-repository' in restricted_apis"):
        TritonServer(tmp_path, model_control_mode="explicit", restricted_apis=("logging",))
    TritonServer(tmp_path, model_control_mode="explicit")  # default restriction: allowed


def _http(url: str, body: bytes | None = None, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json",
                                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


HTTP_ADMIN_CALLS = {  # restricted API -> (path, body) of one call
    "model-repository": ("/v2/repository/index", b"{}"),
    "model-config": ("/v2/models/add_one/config", None),
    "logging": ("/v2/logging", None),
    "shared-memory": ("/v2/systemsharedmemory/status", None),
    "trace": ("/v2/trace/setting", None),
}


@pytest.mark.triton
def test_admin_apis_need_the_key_over_http_and_grpc(tmp_path, start_triton):
    repo = tmp_path / "repo"
    write_python_model(repo, "add_one", ADD_ONE_MODEL)
    server = start_triton(repo, admin_key=KEY, model_control_mode="explicit")
    assert set(HTTP_ADMIN_CALLS) == set(RESTRICTED_APIS)
    for api, (path, body) in HTTP_ADMIN_CALLS.items():
        assert _http(server.http_url + path, body) == 403, f"{api} open without the key"
        assert _http(server.http_url + path, body, server.admin_headers) == 200, f"{api} with the key"
    unload = server.http_url + "/v2/repository/models/add_one/unload"
    assert _http(unload, b"{}") == 403
    infer = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    assert _http(server.http_url + "/v2/models/add_one/infer", infer.encode()) == 200  # open
    assert _http(server.http_url + "/v2/models/add_one/stats") == 200  # statistics: open
    assert _http(server.http_url + "/v2/health/ready") == 200

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        calls = (client.get_model_repository_index, lambda **kw: client.get_model_config("add_one", **kw),
                 client.get_log_settings, client.get_system_shared_memory_status,
                 client.get_trace_settings, lambda **kw: client.unload_model("add_one", **kw))
        for call in calls:
            with pytest.raises(InferenceServerException, match="This protocol is restricted"):
                call()
            if call is not calls[-1]:  # with the key it answers (the unload is left for later)
                call(headers=server.admin_grpc_headers)
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.get_model_config("add_one", headers=server.admin_headers)  # the HTTP name: refused
        assert client.get_model_config("add_one", headers=server.admin_grpc_headers).config.name == "add_one"
        assert client.is_model_ready("add_one")  # the refused unload did nothing
    finally:
        client.close()
    assert KEY not in server.log_text()
    server.unload_model("add_one")  # the launcher sends the key itself
    assert _http(server.http_url + "/v2/models/add_one/ready") != 200


def test_restricted_list_is_documented():
    text = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    for api in RESTRICTED_APIS:
        assert f"`{api}`" in text
    assert ADMIN_HEADER in text and ADMIN_KEY_ENV in text


def test_two_servers_writing_the_key_file_at_once_never_fail(tmp_path):
    """Two `serve` processes on one data directory write the admin key file at the same moment
    (it failed with FileExistsError between one's unlink and the other's exclusive create)."""
    import stat
    import threading

    from tokenrouter_backend.server.restrictions import write_key_file

    path, errors = tmp_path / "admin.key", []

    def writer(key: str) -> None:
        for _ in range(300):
            try:
                write_key_file(path, key)
            except OSError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in ("a" * 32, "b" * 32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and path.read_text() in ("a" * 32 + "\n", "b" * 32 + "\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and [p.name for p in tmp_path.iterdir()] == ["admin.key"]
