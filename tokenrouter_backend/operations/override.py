"""Roll-back switch: a watched JSON file forces every request into one mode, no restart.

    echo '{"mode": "heavy"}' > /path/override.json     # every new request runs heavy-only
    echo '{}' > /path/override.json                    # back to normal (or delete the file)

The file is stat()ed at most every ``check_ms`` on the request path (one syscall); it is
re-read only when its mtime or size changed. A file that does not parse (half written,
bad mode) keeps the previous state and is retried at the next check. Requests already
running keep their mode: the switch applies to requests admitted after it is seen.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

from tokenrouter_backend.core.protocol.names import MODES, Mode

DEFAULT_CHECK_MS = 1000  # override_check_ms default


class OverrideWatcher:
    """``mode()`` -> the forced mode, or None."""

    def __init__(self, path: str, check_ms: float = DEFAULT_CHECK_MS,
                 clock: Callable[[], float] = time.monotonic, warn: Callable[[str], None] = lambda m: None):
        self.path, self.check_s, self.clock, self.warn = path, check_ms / 1e3, clock, warn
        self._next_check = 0.0
        self._signature: tuple | None = None
        self._mode: Mode | None = None

    def mode(self) -> Mode | None:
        now = self.clock()
        if now >= self._next_check:
            self._next_check = now + self.check_s
            self._refresh()
        return self._mode

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._signature, self._mode = None, None  # no file: no override
            return
        signature = (st.st_mtime_ns, st.st_size)
        if signature == self._signature:
            return
        try:
            self._mode = parse_override(open(self.path, encoding="utf-8").read())
            self._signature = signature
        except (OSError, ValueError) as exc:
            kept = None if self._mode is None else self._mode.value
            self.warn(f"override file {self.path}: {exc}; keeping mode {kept!r}")


def parse_override(text: str) -> Mode | None:
    """'{"mode": "heavy"}' -> Mode.HEAVY; '{}' / '{"mode": null}' / '' -> None; else ValueError."""
    if not text.strip():
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object like {\"mode\": \"heavy\"}")
    mode = data.get("mode")
    if mode in (None, ""):
        return None
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return Mode(mode)
