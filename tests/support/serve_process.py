"""`tokenrouter serve` as a subprocess for tests: start it, read its lines, find its server.

``tokenrouter(...)`` runs ``python -m tokenrouter_backend`` with this checkout first on the
path; ``serve_args`` serves a repository on free ports; ``server_pids`` finds every
tritonserver and stub process of a repository (by command line). `ServeLines` reads the
output of a running serve in background threads, so its pipes never fill.
"""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SERVE_TIMEOUT_S = 120


def tokenrouter(*args: str, data_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TOKENROUTER_DATA=str(data_dir))
    return subprocess.Popen([sys.executable, "-m", "tokenrouter_backend", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def serve_args(repo: Path, tmp_path: Path) -> list[str]:
    return ["serve", "--repository", str(repo), "--http-port", "0", "--grpc-port", "0",
            "--metrics-port", "0", "--log-file", str(tmp_path / "serve.log"),
            "--ready-timeout", str(SERVE_TIMEOUT_S)]


def server_pids(repo: Path) -> list[int]:
    """tritonserver (``--model-repository=REPO``) and stub (``REPO/<model>/1/model.py``) pids."""
    pids = []
    for pattern in (f"--model-repository={repo}", f"{repo}/"):
        out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    return pids


def children(pid: int) -> list[int]:
    """Live (non-zombie) child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # state ppid ...
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def stub_pid(server_pid: int, model: str) -> int:
    """The Python-backend stub serving ``model`` among tritonserver's children."""
    from tokenrouter_backend.server.pids import stub_model

    for pid in children(server_pid):
        if stub_model(pid) == model:
            return pid
    raise AssertionError(f"no stub process for {model} among the children of {server_pid}")


class ServeLines:
    """Collects a serve process's stdout (line by line, waitable) and stderr."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, sink in ((proc.stdout, self._out), (proc.stderr, self.stderr.append)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    def _out(self, line: str) -> None:
        self.stdout.append(line)
        self.lines.put(line)

    @staticmethod
    def _pump(stream, sink) -> None:
        for line in stream:
            sink(line)

    def wait_for(self, pattern: str, timeout_s: float = SERVE_TIMEOUT_S) -> re.Match:
        """The first stdout line from now on matching ``pattern`` (regex search)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                ended = self.proc.poll() is not None
                if ended or time.monotonic() > deadline:
                    why = f"serve exited with {self.proc.returncode}" if ended else f"{timeout_s:.0f} s passed"
                    raise AssertionError(f"no line matching {pattern!r} ({why}); stdout:\n{self.text}\n"
                                         f"stderr:\n{self.errors}") from None
                continue
            found = re.search(pattern, line)
            if found:
                return found

    @property
    def text(self) -> str:
        return "".join(self.stdout)

    @property
    def errors(self) -> str:
        return "".join(self.stderr)
