"""The one error the server layer raises: the server exited, a model failed, or time ran out."""
from __future__ import annotations

from pathlib import Path


class TritonServerError(RuntimeError):
    """The server exited, a model failed to load, or it was not ready in time.

    ``model_errors`` maps each failing model to its error text from the server log.
    """

    def __init__(self, message: str, model_errors: dict[str, str] | None = None,
                 log_path: Path | None = None, log_tail: str = ""):
        self.model_errors = dict(model_errors or {})
        self.log_path = log_path
        self.log_tail = log_tail
        details = "".join(f"\n  model '{name}': " + "\n    ".join(err.splitlines())
                          for name, err in self.model_errors.items())
        where = f"\n  server log: {log_path}" if log_path else ""
        super().__init__(f"{message}{details}{where}")
