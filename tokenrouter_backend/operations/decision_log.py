"""Decision log: one JSON line per block, written off the request path.

``DecisionLog.submit`` puts a ``BlockRecord`` on a bounded queue and returns at once; a
writer thread serializes and appends it. When the queue is full the record is dropped and
counted (``dropped``) — the request path never waits for the disk. The file is capped at
``max_bytes`` and rotated like logrotate: ``log`` -> ``log.1`` -> ... -> ``log.<backups>``
(the oldest is deleted).

Line format (keys stable, see docs/operations.md):
  {"request_id", "position", "mode", "action", "block_size", "drafted", "confidence",
   "entropy", "committed_light", "heavy_agree", "heavy_prob", "rolled_back", "heavy_calls",
   "heavy_ms", "heavy_forward_ms", "light_ms", "latency_ms", "committed", "token_class",
   "router_score", "acceptance", "output_from", "output", "output_kinds", "margin", "time"}
("margin": light top-1 minus top-2 probability per drafted token; absent or [] in logs
written before it existed, or when the light branch does not report it.)
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import Iterator

from tokenrouter_backend.core.loop.hooks import BlockRecord

DEFAULT_MAX_BYTES = 64 << 20  # decision_log_max_mb default: 64 MiB per file
DEFAULT_BACKUPS = 3  # decision_log_backups default: rotated files kept
DEFAULT_QUEUE = 10_000  # records waiting for the writer before new ones are dropped
FLUSH_EVERY_S = 0.5  # writer flushes at least this often when idle


def record_to_json(record: BlockRecord) -> str:
    d = dataclasses.asdict(record)
    for key in ("heavy_ms", "heavy_forward_ms", "light_ms", "latency_ms"):
        d[key] = round(d[key], 3)
    d["heavy_prob"] = [None if math.isnan(p) else p for p in d["heavy_prob"]]
    d["time"] = round(time.time(), 3)
    return json.dumps(d, separators=(",", ":"))


def record_from_dict(d: dict) -> BlockRecord:
    fields = {f.name for f in dataclasses.fields(BlockRecord)}
    values = {k: v for k, v in d.items() if k in fields}
    for key in ("drafted", "confidence", "entropy", "heavy_agree", "token_class", "router_score", "output", "margin"):
        values[key] = tuple(values.get(key, ()))
    values["heavy_prob"] = tuple(float("nan") if p is None else p for p in values.get("heavy_prob", ()))
    return BlockRecord(**values)


def read_log(path: str | os.PathLike) -> Iterator[BlockRecord]:
    """Records of one log file (a torn last line from a crash is skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield record_from_dict(json.loads(line))
            except (ValueError, TypeError):
                continue


class DecisionLog:
    """Bounded, rotating JSON-lines writer with its own thread."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES,
                 backups: int = DEFAULT_BACKUPS, queue_size: int = DEFAULT_QUEUE):
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0  # records lost because the queue was full (read by metrics)
        self.written = 0
        self._stop = threading.Event()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="tokenrouter-decision-log", daemon=True)
        self._thread.start()

    def submit(self, record: BlockRecord) -> bool:
        """Queue one record; False (and counted) when the queue is full. Never blocks."""
        try:
            self.queue.put_nowait(record)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        f = open(self.path, "a", encoding="utf-8")
        try:
            while not (self._stop.is_set() and self.queue.empty()):
                try:
                    record = self.queue.get(timeout=FLUSH_EVERY_S)
                except queue.Empty:
                    f.flush()
                    continue
                line = record_to_json(record) + "\n"
                if f.tell() + len(line) > self.max_bytes and f.tell() > 0:
                    f.close()
                    self._rotate()
                    f = open(self.path, "a", encoding="utf-8")
                f.write(line)
                self.written += 1
        finally:
            f.close()

    def _rotate(self) -> None:
        if self.backups <= 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
