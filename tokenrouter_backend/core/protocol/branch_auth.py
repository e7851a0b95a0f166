"""The deployment's branch key: the branch models ``heavy``/``light`` answer only the router.

A client that called a branch model directly could pick any session id and skip every router
limit, so the router sends a per-deployment secret as the request parameter
``KEY_PARAMETER`` on each branch step (BLS and remote gRPC alike) and a branch refuses a
request without the right one. The key is ``$TOKENROUTER_BRANCH_KEY`` when set (every server
of a deployment must then see the same value), else the ``branch.key`` file the exporter
writes into each of the router, heavy and light model directories (a fresh random key per
export, mode 0600). A model finding neither fails to load. Keys are compared in constant
time and never logged.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path

KEY_PARAMETER = "tokenrouter_branch_key"
KEY_ENV = "TOKENROUTER_BRANCH_KEY"
KEY_FILE = "branch.key"
KEY_MODELS = ("router", "heavy", "light")  # model directories that get the key file
KEY_BYTES = 32
MIN_KEY_CHARS = 16


class BranchKeyError(ValueError):
    """No usable branch key for this model."""


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def write_key_files(repository: Path, key: str | None = None) -> str:
    """Write one key into ``branch.key`` of each KEY_MODELS directory present; returns it."""
    key = key or new_key()
    for name in KEY_MODELS:
        model_dir = Path(repository) / name
        if model_dir.is_dir():
            path = model_dir / KEY_FILE
            path.unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(key + "\n")
    return key


def load_key(model_dir: Path, environ=os.environ) -> str:
    """The deployment key: $TOKENROUTER_BRANCH_KEY, else ``model_dir/branch.key``."""
    key = (environ.get(KEY_ENV) or "").strip()
    where = f"${KEY_ENV}"
    if not key:
        path = Path(model_dir) / KEY_FILE
        where = str(path)
        try:
            key = path.read_text().strip()
        except OSError:
            raise BranchKeyError(
                f"no branch key: set ${KEY_ENV} (the same value on every server of the deployment) "
                f"or export the repository with `tokenrouter export`, which writes {KEY_FILE} into "
                f"the {', '.join(KEY_MODELS)} model directories") from None
    if len(key) < MIN_KEY_CHARS:
        raise BranchKeyError(f"branch key from {where} is too short: need at least "
                             f"{MIN_KEY_CHARS} characters, got {len(key)}")
    return key


def key_parameters(key: str) -> dict[str, str]:
    """The request parameters a branch step carries."""
    return {KEY_PARAMETER: key}


class BranchGuard:
    """Checks a branch request's parameters against the deployment key."""

    def __init__(self, model_name: str, key: str):
        self.model_name = model_name
        self._key = key.encode()

    def refusal(self, parameters: str | dict | None) -> str | None:
        """``None`` when the request carries the key, else the error message for its client."""
        given = _parameter(parameters)
        if given is None:
            problem = f"request parameter '{KEY_PARAMETER}' is missing"
        elif hmac.compare_digest(given.encode(), self._key):
            return None
        else:
            problem = f"request parameter '{KEY_PARAMETER}' does not match this deployment's key"
        return (f"{self.model_name}: refused: branch models answer only the TokenRouter router "
                f"({problem}); send generation requests to the 'tokenrouter' ensemble")


def _parameter(parameters: str | dict | None) -> str | None:
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters) if parameters else {}
        except ValueError:
            return None
    if not isinstance(parameters, dict):
        return None
    value = parameters.get(KEY_PARAMETER)
    return value if isinstance(value, str) else None
