"""Two branches on one CPU: each branch's ONNX forward alone and beside the other's.

Spawns one process per branch of an exported repository; each loads its ``OnnxCausalLM``
with the given thread count, caches ``--past`` positions and runs ``forward`` over
``--heavy-new`` / ``--light-new`` tokens in a loop for ``--seconds`` (batch 1), optionally
taking a file lock around each forward (serialized). Reports forwards/s and the median
ms per case, and each branch's share of its own rate alone at ``--threads`` (the first
case, always run). The cases (``--cases``, names below with T = ``--threads``):

- ``alone`` / ``alone-1t``: each branch by itself at T threads / 1 thread;
- ``together`` / ``together-1+1`` / ``together-T+1``: both at once at T+T, 1+1, T+1;
- ``serialized``: T+T, each forward under one file lock;
- ``nospin`` / ``nospin-dyn``: T+T with thread spinning off (and dynamic blocks,
  ``--dynamic-block-base``), and ``alone-nospin`` / ``alone-nospin-dyn``: each alone so.

    python -m tokenrouter_backend.client.contention --repo REPO [--cases ...] [--seconds 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.names import HEAVY, LIGHT
from tokenrouter_backend.engine.onnx_lm import OrtThreading


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


CASES = ("alone", "alone-1t", "together", "together-1+1", "together-T+1", "serialized",
         "nospin", "nospin-dyn", "alone-nospin", "alone-nospin-dyn")


def _cases(names: list[str], t: int, heavy_new: int, light_new: int, dyn: int):
    """(name, workers, serialized) per case name; ``alone`` first (the shares' reference)."""
    def pair(ht, lt, threading=None):
        threading = threading or OrtThreading()
        return [Worker(HEAVY, ht, heavy_new, threading), Worker(LIGHT, lt, light_new, threading)]

    nospin, nospin_dyn = OrtThreading(spinning=False), OrtThreading(spinning=False, dynamic_block_base=dyn)
    table = {
        "alone": [(f"alone {t}t", [w], False) for w in pair(t, t)],
        "alone-1t": [("alone 1t", [w], False) for w in pair(1, 1)],
        "together": [(f"together {t}+{t}", pair(t, t), False)],
        "together-1+1": [("together 1+1", pair(1, 1), False)],
        "together-T+1": [(f"together {t}+1", pair(t, 1), False)],
        "serialized": [(f"together {t}+{t} serialized", pair(t, t), True)],
        "nospin": [(f"together {t}+{t} no spinning", pair(t, t, nospin), False)],
        "nospin-dyn": [(f"together {t}+{t} no spinning, dynamic blocks {dyn}", pair(t, t, nospin_dyn), False)],
        "alone-nospin": [(f"alone {t}t no spinning", [w], False) for w in pair(t, t, nospin)],
        "alone-nospin-dyn": [(f"alone {t}t no spinning, dynamic blocks {dyn}", [w], False)
                             for w in pair(t, t, nospin_dyn)],
    }
    return [case for name in ["alone"] + [n for n in names if n != "alone"] for case in table[name]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="an exported model repository (heavy/1, light/1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of a branch that has the machine (default: all cores)")
    ap.add_argument("--heavy-new", type=int, default=8, help="tokens per heavy forward (default 8)")
    ap.add_argument("--light-new", type=int, default=1, help="tokens per light forward (default 1)")
    ap.add_argument("--past", type=int, default=256, help="cached positions (default 256)")
    ap.add_argument("--seconds", type=float, default=20.0, help="loop time per case (default 20)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, from {', '.join(CASES)} (default: all)")
    ap.add_argument("--dynamic-block-base", type=int, default=4,
                    help="dynamic block base of the *-dyn cases (default 4)")
    ap.add_argument("--out", help="JSON lines file for the cases")
    a = ap.parse_args(argv)
    names = [n for n in a.cases.split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    t = a.threads
    alone: dict[str, float] = {}
    rows = []
    for name, workers, serialized in _cases(names, t, a.heavy_new, a.light_new, a.dynamic_block_base):
        res = run_case(a.repo, workers, a.past, a.seconds, serialized)
        for role, r in res.items():
            if name == f"alone {t}t":
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
