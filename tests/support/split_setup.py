"""The split setup in tests: heavy-only and router repositories, crashes, streams in flight.

``copy_models`` builds a repository from some of the tiny repository's models;
``set_heavy_url`` points a router config at one heavy server or a comma-separated list;
``crash`` SIGKILLs a server's whole process group (stubs included) and reaps it;
``InFlight`` runs several router streams in threads and tells when each has produced
tokens, so a test can kill a server while they are really generating.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

from support.serving_helpers import router_tokens

PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n",
           "for i in range(10):\n    ", "def add(a, b):\n    return", "raise ValueError("]
MODES = ("heavy", "verify")
MAX_TOKENS = 24
ROUTER_MODELS = ("router", "light", "preprocessing", "postprocessing", "tokenrouter")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def copy_models(src: Path, dst: Path, models) -> Path:
    for name in models:
        shutil.copytree(src / name, dst / name, ignore=IGNORE)
    return dst


def set_heavy_url(router_config: Path, url: str) -> None:
    text = router_config.read_text()
    new, n = re.subn(r'(key: "heavy_url" value: \{ string_value: )""', rf'\1"{url}"', text)
    assert n == 1, "router config lacks the heavy_url parameter"
    router_config.write_text(new)


def generate_all(grpc_url: str, tokenizer) -> dict:
    return {(p, m): router_tokens(grpc_url, tokenizer.encode(p).ids, router_mode=m, max_tokens=MAX_TOKENS)[0]
            for p in PROMPTS for m in MODES}


def single_server_reference(tiny_repository: Path, tokenizer, log_dir: Path) -> dict:
    """``generate_all`` on the tiny repository served alone (stopped before the split servers start)."""
    from tokenrouter_backend.server.process import TritonServer

    server = TritonServer(tiny_repository, log_path=log_dir / "triton.log")
    try:
        server.start()
        server.wait_ready(120)
        return generate_all(server.grpc_url, tokenizer)
    finally:
        server.stop()


def crash(server) -> None:
    """SIGKILL the server's process group (a crash, not a shutdown) and reap it."""
    os.killpg(server.pid, signal.SIGKILL)
    server.stop()  # reaps it and unlinks its shared memory; nothing left to signal


class InFlight:
    """``n`` streamed router requests in threads; ``wait_generating`` until each streamed tokens."""

    def __init__(self, grpc_url: str, prompt_ids: list[list[int]], modes, max_tokens: int, n: int):
        self.started = [threading.Event() for _ in range(n)]
        self.ended_at: list[float | None] = [None] * n
        self.pool = cf.ThreadPoolExecutor(n)
        self.jobs = [self.pool.submit(self._one, i, grpc_url, prompt_ids[i % len(prompt_ids)],
                                      modes[i % len(modes)], max_tokens) for i in range(n)]

    def _one(self, i: int, grpc_url: str, ids: list[int], mode: str, max_tokens: int):
        try:
            return router_tokens(grpc_url, ids, router_mode=mode, max_tokens=max_tokens, stream=True,
                                 on_response=self.started[i].set)
        finally:
            self.ended_at[i] = time.monotonic()

    def wait_generating(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for event in self.started:
            assert event.wait(max(0.0, deadline - time.monotonic())), "a stream produced no token in time"
        assert not any(job.done() for job in self.jobs), "a stream ended before the kill: make them longer"

    def outcomes(self, timeout_s: float) -> list[tuple[list[int] | None, dict, str | None]]:
        """(tokens, routing stats, None) or (None, {}, error) per stream, waiting at most ``timeout_s``."""
        done, pending = cf.wait(self.jobs, timeout=timeout_s)
        assert not pending, f"{len(pending)} of {len(self.jobs)} streams hang after {timeout_s:.0f} s"
        out = []
        for job in self.jobs:
            exc = job.exception()
            out.append((None, {}, str(exc)) if exc is not None else (*job.result(), None))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
