"""Console output of ``tokenrouter export``: one line per stage, library noise in a log file.

Loading, tracing and quantizing print hundreds of lines (torch ``TracerWarning``s,
transformers deprecation warnings and tqdm bars, ONNX Runtime's quantization advice). While an
``ExportLog`` is active, each ``stage`` prints ``<role>: <what> ...`` before the work and the
seconds it took after it, and the work's own output — Python ``warnings``, ``logging``
records, anything written to file descriptors 1 and 2 (tqdm, C++ libraries) — goes to the log
file (``<data>/logs/export-<time>-<pid>.log``). Errors still reach the console: the caller
prints the exception after the stage, and a failed stage says where the log is.

Without an active ``ExportLog`` (the pipeline called as a library, in tests) ``stage`` does
nothing, so output stays wherever the caller sends it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from tokenrouter_backend.server import paths

_active: ExportLog | None = None


def default_log_path() -> Path:
    return paths.log_dir() / f"export-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


class ExportLog:
    """The log file and console of one export run (see the module docstring)."""

    def __init__(self, path: Path, console: TextIO | None = None):
        self.path = Path(path)
        self.console = console or sys.stdout
        self.noise_lines = 0  # lines the stages wrote to the log (0: nothing was hidden)

    def say(self, line: str) -> None:
        print(line, file=self.console, flush=True)

    @contextlib.contextmanager
    def stage(self, role: str, what: str) -> Iterator[None]:
        print(f"{role}: {what} ...", end="", file=self.console, flush=True)
        t0 = time.perf_counter()
        try:
            with self._into_log(f"{role}: {what}"):
                yield
        except BaseException:
            self.say(f" failed after {time.perf_counter() - t0:.1f} s (library output: {self.path})")
            raise
        self.say(f" {time.perf_counter() - t0:.1f} s")

    @contextlib.contextmanager
    def _into_log(self, title: str) -> Iterator[None]:
        """Send fds 1 and 2, ``warnings`` and ``logging`` to the log file for the block."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        with open(self.path, "a", encoding="utf-8") as log:
            log.write(f"===== {title}\n")
            log.flush()
            start = log.tell()
            saved = [os.dup(1), os.dup(2)]
            handler = logging.StreamHandler(log)
            handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
            root = logging.getLogger()
            root.addHandler(handler)  # also keeps logging.warning() from adding a stderr handler
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                with warnings.catch_warnings():
                    warnings.showwarning = _to(log)
                    yield
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(ValueError, OSError):
                        stream.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
                root.removeHandler(handler)
                log.flush()
                log.seek(0, os.SEEK_END)
                self.noise_lines += _count_lines(self.path, start)


def _to(log: TextIO):
    def show(message, category, filename, lineno, file=None, line=None):
        log.write(warnings.formatwarning(message, category, filename, lineno, line))
        log.flush()
    return show


def _count_lines(path: Path, start: int) -> int:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read().count(b"\n")


@contextlib.contextmanager
def active(log: ExportLog) -> Iterator[ExportLog]:
    """Make ``log`` the one ``stage`` reports to, for the block."""
    global _active
    previous, _active = _active, log
    try:
        yield log
    finally:
        _active = previous


@contextlib.contextmanager
def stage(role: str, what: str) -> Iterator[None]:
    """A stage of the active ``ExportLog``; nothing when none is active."""
    if _active is None:
        yield
    else:
        with _active.stage(role, what):
            yield
