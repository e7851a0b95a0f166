#!/usr/bin/env python
"""Throughput of ``n`` = 4 choices in one completion against four single completions sent one
after another, through the OpenAI front on a served pair (issue: OpenAI-API extras).

    .venv/bin/python research/studies/n_choices_throughput.py --url http://127.0.0.1:OPENAI_PORT/v1 --out OUT

Four held-out prompts (two code, one structured, one text from the bench's workloads), 64
new tokens, temperature 0.8, verify mode, answer cache off; per prompt, in alternating
order: one request with ``n`` 4 and ``seed`` s, and four sequential requests with seeds
s … s + 3 (the same generations, so the same tokens: checked). Each arm has a cache salt of
its own, so neither reads the other's prefix blocks; within an arm the prompt's KV is
shared as served: the n request's choices read its first choice's blocks, and the
sequential requests read the first request's (the same salt), so the baseline keeps the
prefix cache a user sending four requests would have. Reports per prompt and
overall: completion tokens per second of each arm, their ratio, and the n request's reuse
(``heavy_reused_tokens`` of choices 1-3).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import requests

from tokenrouter_backend.bench.workloads import CODE_PROMPTS, STRUCTURED_PROMPTS, TEXT_PROMPTS

N = 4


def complete(url: str, prompt: str, **body) -> tuple[dict, float]:
    start = time.perf_counter()
    resp = requests.post(f"{url}/completions", json={"model": "tokenrouter", "prompt": prompt, **body}, timeout=900)
    resp.raise_for_status()
    return resp.json(), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the OpenAI base URL, http://HOST:PORT/v1")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = list(CODE_PROMPTS.items())[:2] + list(STRUCTURED_PROMPTS.items())[:1] + list(TEXT_PROMPTS.items())[:1]
    common = {"max_tokens": 64, "temperature": 0.8, "router_mode": "verify", "answer_cache": False,
              "block_schedule": "fixed"}
    rows, totals = [], {"n_tokens": 0, "n_s": 0.0, "seq_tokens": 0, "seq_s": 0.0}
    for i, (name, text) in enumerate(prompts):
        seed = 100 + i

        def n_arm(text=text, seed=seed, i=i):
            return complete(args.url, text, n=N, seed=seed, cache_salt=f"n-{i}", **common)

        def seq_arm(text=text, seed=seed, i=i):
            out = [complete(args.url, text, seed=seed + j, cache_salt=f"seq-{i}", **common) for j in range(N)]
            return [o[0] for o in out], sum(o[1] for o in out)

        if i % 2 == 0:
            (n_body, n_s), (seq_bodies, seq_s) = n_arm(), seq_arm()
        else:
            (seq_bodies, seq_s), (n_body, n_s) = seq_arm(), n_arm()
        n_tokens = n_body["usage"]["completion_tokens"]
        seq_tokens = sum(b["usage"]["completion_tokens"] for b in seq_bodies)
        row = {"prompt": name, "n_tokens": n_tokens, "n_s": round(n_s, 2), "seq_tokens": seq_tokens,
               "seq_s": round(seq_s, 2), "ratio": (n_tokens / n_s) / (seq_tokens / seq_s),
               "same_texts": [c["text"] for c in n_body["choices"]] == [b["choices"][0]["text"] for b in seq_bodies],
               "reused": [c["routing_stats"]["heavy_reused_tokens"] for c in n_body["choices"]]}
        rows.append(row)
        for k in totals:
            totals[k] += row[k]
        print(json.dumps(row), flush=True)
    summary = {"prompts": len(rows), "tok_s_n": totals["n_tokens"] / totals["n_s"],
               "tok_s_sequential": totals["seq_tokens"] / totals["seq_s"]}
    summary["ratio"] = summary["tok_s_n"] / summary["tok_s_sequential"]
    print(json.dumps(summary))
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
