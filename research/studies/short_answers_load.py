"""Where a short answer's time goes under concurrency: the short-answer workload's chat
prompts, C closed-loop streams per mode (modes interleaved per concurrency, order rotated),
each request's routing_stats phases (queue, heavy's first step, light's first step and when
it began, light / heavy time, vouching, emit) and the client's TTFT, inter-token gap and
tokens/s; medians per (mode, concurrency) and tokens/s ratios to heavy-only.

    .venv/bin/python research/studies/short_answers_load.py --url 127.0.0.1:8001 \
        --repo REPO --concurrency 1,4,8 --per-stream 3 --out OUT
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from tokenrouter_backend.bench.arm_prompts import nonce
from tokenrouter_backend.bench.short_answers import short_answer_prompts
from tokenrouter_backend.bench.traffic import repo_tokenizer
from tokenrouter_backend.client import triton_client

PHASES = ("queue_ms", "heavy_first_ms", "light_start_ms", "light_first_ms", "light_ms", "heavy_ms",
          "vouch_ms", "emit_ms", "router_overhead_ms", "first_token_ms", "total_ms")


def render_with(repo: Path):
    from tokenrouter_backend.openai_front.chat_template import ChatTemplate

    return ChatTemplate(repo / "preprocessing" / "1" / "tokenizer").render


def run_point(url, prompts, mode, c, per_stream, max_tokens):
    jobs = [prompts[i % len(prompts)] for i in range(c * per_stream)]
    out, lock = [], threading.Lock()
    it = iter(jobs)

    def stream():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            r = triton_client.generate_grpc(url, p.text, stream=True, router_mode=mode, max_tokens=max_tokens,
                                            answer_cache=False, timeout_s=1800)
            gaps = r.inter_token_gaps
            with lock:
                out.append({"id": p.id, "ttft_ms": r.ttft_s * 1e3, "latency_ms": r.latency_s * 1e3,
                            "gap_ms": statistics.mean(gaps) * 1e3 if gaps else 0.0, "tokens": r.tokens,
                            "stats": r.stats})
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        list(pool.map(lambda _: stream(), range(c)))
    wall = time.perf_counter() - t0
    return {"mode": mode, "concurrency": c, "wall_s": wall, "tokens": sum(r["tokens"] for r in out),
            "tok_s": sum(r["tokens"] for r in out) / wall, "requests": out}


def summary(point):
    rs = point["requests"]
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    row = {"mode": point["mode"], "c": point["concurrency"], "n": len(rs), "tok_s": point["tok_s"],
           "ttft_p50": med([r["ttft_ms"] for r in rs]), "gap": med([r["gap_ms"] for r in rs]),
           "tokens": med([r["tokens"] for r in rs]),
           "light_opened": sum(1 for r in rs if r["stats"].get("light_calls", 0)) / max(1, len(rs))}
    for ph in PHASES:
        row[ph] = med([r["stats"].get(ph, 0.0) for r in rs])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--modes", default="heavy,verify,route")
    ap.add_argument("--per-stream", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--no-rag", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    render, tok = render_with(a.repo), repo_tokenizer(a.repo)
    modes = a.modes.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    points = []
    for i, c in enumerate(int(x) for x in a.concurrency.split(",")):
        for j in range(len(modes)):
            mode = modes[(i + j) % len(modes)]
            prompts = short_answer_prompts(render, nonce=nonce(mode, c), tokenizer=tok, rag=not a.no_rag)
            p = run_point(a.url, prompts, mode, c, a.per_stream, a.max_tokens)
            points.append(p)
            s = summary(p)
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in s.items()}), flush=True)
    (a.out / "points.json").write_text(json.dumps(points, indent=1))
    rows = [summary(p) for p in points]
    heavy = {r["c"]: r["tok_s"] for r in rows if r["mode"] == "heavy"}
    for r in rows:
        r["x_heavy"] = r["tok_s"] / heavy[r["c"]] if heavy.get(r["c"]) else float("nan")
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
