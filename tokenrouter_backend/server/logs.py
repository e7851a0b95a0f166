"""Reading a tritonserver log: which models failed and why, and its last lines."""
from __future__ import annotations

import re

LOG_TAIL_LINES = 40
FAILED_LOAD_RE = re.compile(r"failed to load '([^']+)'(?: version \d+)?: (.*)")


def parse_model_errors(log_text: str) -> dict[str, str]:
    """Failing models and their error text from a tritonserver log.

    Triton logs ``failed to load 'NAME' version N: ERROR`` per failing model and, at start-up,
    a table of model states (``| NAME | 1 | UNAVAILABLE: ERROR |``, long cells wrapped onto
    continuation rows). The "failed to load" lines win; the table fills in the rest.
    """
    errors: dict[str, str] = {}
    for line in log_text.splitlines():
        match = FAILED_LOAD_RE.search(line)
        if match:
            errors.setdefault(match.group(1), _unescape(match.group(2).rstrip('"')).strip())
    for name, status in _model_table_rows(log_text):
        if status.startswith("UNAVAILABLE") and name not in errors:
            errors[name] = status.removeprefix("UNAVAILABLE:").strip()
    return errors


def _unescape(message: str) -> str:
    """Triton logs messages quoted, with newlines and quotes escaped."""
    return message.replace("\\n", "\n").replace('\\"', '"')


def _model_table_rows(log_text: str) -> list[tuple[str, str]]:
    """(model, status) rows of the last 'Model | Version | Status' table in the log."""
    rows: list[list[str]] = []
    in_table = False
    for line in log_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[:3] == ["Model", "Version", "Status"]:
            rows, in_table = [], True
        elif in_table and cells and len(cells) == 3:
            if cells[0]:
                rows.append(cells)
            elif rows:  # continuation of a wrapped cell
                rows[-1][2] = f"{rows[-1][2]} {cells[2]}".strip()
        elif in_table and not line.startswith("+"):
            in_table = False
    return [(r[0], r[2]) for r in rows]


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
