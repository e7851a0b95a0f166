"""The branch key: written by the exporter, read from env or file, checked in constant time."""
from __future__ import annotations

import json
import stat

import pytest

from tokenrouter_backend.core.protocol import branch_auth
from tokenrouter_backend.core.protocol.branch_auth import (
    KEY_ENV,
    KEY_FILE,
    KEY_PARAMETER,
    BranchGuard,
    BranchKeyError,
    load_key,
    write_key_files,
)


def test_write_key_files_one_private_key_per_deployment(tmp_path):
    for name in ("router", "heavy", "light", "preprocessing"):
        (tmp_path / name).mkdir()
    key = write_key_files(tmp_path)
    assert len(key) >= 40
    for name in ("router", "heavy", "light"):
        path = tmp_path / name / KEY_FILE
        assert path.read_text().strip() == key
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert load_key(tmp_path / name, environ={}) == key
    assert not (tmp_path / "preprocessing" / KEY_FILE).exists()
    assert write_key_files(tmp_path) != key  # a fresh key per export, old file replaced


def test_environment_overrides_the_file(tmp_path):
    (tmp_path / KEY_FILE).write_text("f" * 20)
    assert load_key(tmp_path, environ={KEY_ENV: " " + "e" * 20 + "\n"}) == "e" * 20
    assert load_key(tmp_path, environ={KEY_ENV: ""}) == "f" * 20
    with pytest.raises(BranchKeyError, match="too short"):
        load_key(tmp_path, environ={KEY_ENV: "abc"})
    with pytest.raises(BranchKeyError, match="no branch key"):
        load_key(tmp_path / "nowhere", environ={})


@pytest.mark.parametrize("parameters, problem", [
    (None, "is missing"), ("", "is missing"), ("{not json", "is missing"), ("[1]", "is missing"),
    (json.dumps({}), "is missing"), (json.dumps({KEY_PARAMETER: 5}), "is missing"),
    (json.dumps({KEY_PARAMETER: "w" * 30}), "does not match"),
    ({KEY_PARAMETER: "r" * 29}, "does not match"),
])
def test_guard_refuses_with_a_clear_message(parameters, problem):
    guard = BranchGuard("heavy", "r" * 30)
    message = guard.refusal(parameters)
    assert message.startswith("heavy: refused: branch models answer only the TokenRouter router")
    assert problem in message and KEY_PARAMETER in message and "r" * 30 not in message


def test_guard_accepts_the_key_and_compares_in_constant_time(monkeypatch):
    calls = []
    real = branch_auth.hmac.compare_digest
    monkeypatch.setattr(branch_auth.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    guard = BranchGuard("light", "r" * 30)
    assert guard.refusal(json.dumps({KEY_PARAMETER: "r" * 30, "other": 1})) is None
    assert guard.refusal({KEY_PARAMETER: "r" * 30}) is None
    assert len(calls) == 2
