#!/usr/bin/env python
"""Two branches on one CPU: each branch's ONNX forward alone and beside the other's.

Spawns one process per branch of an exported repository; each loads its ``OnnxCausalLM``
with the given thread count, caches ``--past`` positions and runs ``forward`` over
``--heavy-new`` / ``--light-new`` tokens in a loop for ``--seconds`` (batch 1), optionally
taking a file lock around each forward (serialized). Reports forwards/s and the median
ms per case, and each branch's share of its own rate alone at ``--threads`` (always
measured first). A case (``--case``, repeatable) is written

- ``H+L``: both branches at once, heavy with thread spec H and light with L;
- ``H+L/lock``: the same with each forward under one file lock (serialized);
- ``alone:S``: each branch by itself with spec S.

A spec is a thread count, then ``n`` for thread spinning off, ``s`` for spinning stopped
when a forward ends, ``d<N>`` for dynamic blocks of base N (``OrtThreading``): ``2``, ``1``,
``2n``, ``2s``, ``2d4``, ``2nd4``. Under ``/lock`` each branch pauses ``LOCK_GAP_S``
after a forward (the server's own bookkeeping between forwards), so the lock can change hands. Default cases:
alone at 1 thread, T+T, 1+1, T+1, T+T serialized, Tn+Tn, Tnd4+Tnd4, alone at Tn and Tnd4.

    .venv/bin/python research/studies/contention.py --repo REPO [--case 2d4+1 ...] [--seconds 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import re
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT
from tokenrouter_backend.engine.onnx_lm import OrtThreading

LOCK_GAP_S = 0.002


@dataclass(frozen=True)
class Worker:
    role: str       # HEAVY or LIGHT
    threads: int    # intra-op threads of its session
    new: int        # tokens per forward
    threading: OrtThreading = OrtThreading()


def _loop(repo: str, w: Worker, past_len: int, seconds: float, lock_path: str | None,
          ready, start, results) -> None:
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM
    lm = OnnxCausalLM(os.path.join(repo, w.role, "1"), intra_op_threads=w.threads, threading=w.threading)
    rng = np.random.default_rng(0)
    past = lm.empty_past(1)
    _, past = lm.forward(rng.integers(0, lm.info.vocab_size, (1, past_len)),
                         np.ones((1, past_len), np.int64), np.arange(past_len)[None], past)
    ids = rng.integers(0, lm.info.vocab_size, (1, w.new))
    mask = np.ones((1, past_len + w.new), np.int64)
    pos = np.arange(past_len, past_len + w.new)[None]
    for _ in range(3):
        lm.forward(ids, mask, pos, past)
    lock = open(lock_path, "w") if lock_path else None  # noqa: SIM115 (held for the loop)
    ready.set()
    start.wait()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.perf_counter()
        lm.forward(ids, mask, pos, past)
        times.append((time.perf_counter() - t0) * 1e3)
        if lock:
            fcntl.flock(lock, fcntl.LOCK_UN)
            time.sleep(LOCK_GAP_S)
    results.put((w.role, len(times) / seconds, float(np.median(times))))


def run_case(repo: str, workers: list[Worker], past_len: int, seconds: float,
             serialized: bool = False) -> dict:
    """Starts the workers together (after all have loaded); returns per role fwd/s and median ms."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in workers]
    with tempfile.TemporaryDirectory() as tmp:
        lock_path = os.path.join(tmp, "forward.lock") if serialized else None
        procs = [ctx.Process(target=_loop, args=(repo, w, past_len, seconds, lock_path, r, start, results))
                 for w, r in zip(workers, readies)]
        for p in procs:
            p.start()
        for r in readies:
            r.wait()
        start.set()
        out = {}
        for _ in procs:
            role, per_s, median = results.get()
            out[role] = {"forwards_per_s": round(per_s, 3), "median_ms": round(median, 1)}
        for p in procs:
            p.join()
    return out


SPEC = re.compile(r"^(\d+)(n?)(s?)(?:d(\d+))?$")
CASE = re.compile(r"^(?:alone:(?P<alone>[^+/]+)|(?P<heavy>[^+/]+)\+(?P<light>[^+/]+)(?P<lock>/lock)?)$")


def parse_spec(spec: str) -> tuple[int, OrtThreading]:
    """'2nd4' -> (2 threads, spinning off, dynamic block base 4); ValueError naming the spec."""
    m = SPEC.match(spec)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"thread spec {spec!r}: expected <threads>[n][s][d<base>], e.g. 2, 1, 2n, 2s, 2d4, 2nd4")
    return int(m.group(1)), OrtThreading(spinning=not m.group(2), spin_between_runs=not m.group(3),
                                         dynamic_block_base=int(m.group(4) or 0))


def parse_case(case: str, heavy_new: int, light_new: int) -> list[tuple[str, list[Worker], bool]]:
    """One --case as (name, workers, serialized) runs: 'alone:S' is one run per branch."""
    m = CASE.match(case)
    if not m:
        raise ValueError(f"case {case!r}: expected H+L, H+L/lock or alone:S")

    def worker(role, spec):
        threads, threading = parse_spec(spec)
        return Worker(role, threads, heavy_new if role == HEAVY else light_new, threading)

    if m.group("alone"):
        return [(f"alone {m.group('alone')}", [worker(role, m.group("alone"))], False) for role in (HEAVY, LIGHT)]
    return [(case, [worker(HEAVY, m.group("heavy")), worker(LIGHT, m.group("light"))], bool(m.group("lock")))]


def default_cases(t: int) -> list[str]:
    return ["alone:1", f"{t}+{t}", "1+1", f"{t}+1", f"{t}+{t}/lock", f"{t}n+{t}n", f"{t}nd4+{t}nd4",
            f"alone:{t}n", f"alone:{t}nd4"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="an exported model repository (heavy/1, light/1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of a branch that has the machine (default: all cores)")
    ap.add_argument("--heavy-new", type=int, default=8, help="tokens per heavy forward (default 8)")
    ap.add_argument("--light-new", type=int, default=1, help="tokens per light forward (default 1)")
    ap.add_argument("--past", type=int, default=256, help="cached positions (default 256)")
    ap.add_argument("--seconds", type=float, default=20.0, help="loop time per case (default 20)")
    ap.add_argument("--case", action="append", dest="cases",
                    help="H+L, H+L/lock or alone:S with thread specs like 2, 1, 2n, 2d4 (repeatable; "
                         "default: a standard set)")
    ap.add_argument("--out", help="JSON lines file for the cases")
    a = ap.parse_args(argv)
    t = a.threads
    reference = f"alone {t}"
    try:
        runs = [run for case in [f"alone:{t}"] + (a.cases or default_cases(t))
                for run in parse_case(case, a.heavy_new, a.light_new)]
    except ValueError as exc:
        ap.error(f"--case: {exc}")
    alone: dict[str, float] = {}
    rows = []
    for name, workers, serialized in runs:
        res = run_case(a.repo, workers, a.past, a.seconds, serialized)
        for role, r in res.items():
            if name == reference:
                alone[role] = r["forwards_per_s"]
            r["share"] = round(r["forwards_per_s"] / alone[role], 3) if alone.get(role) else None
        row = {"case": name, **res}
        if len(res) == 2 and all(r["share"] is not None for r in res.values()):
            row["share_sum"] = round(sum(r["share"] for r in res.values()), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
