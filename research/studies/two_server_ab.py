#!/usr/bin/env python
"""Two servers, one run: the same requests to a server built from one commit and a server
built from another, interleaved, to show a change keeps the answers and the speed.

    .venv/bin/python research/studies/two_server_ab.py --a HOST:PORT --b HOST:PORT --out OUT.jsonl

For each of the first six code prompts of the benchmark's code workload: both servers
prewarmed with the prompt (``arm_prompts.PREWARM_REQUESTS``), then every mode (heavy,
light, verify, route) greedy and seeded-sampled, each request sent to both servers in an
order that alternates per request, answer cache off. Prints, per (mode, sampling), how many
answers are identical across the two servers and each server's tokens/s; writes every
answer to OUT (JSON lines). ``--fixed-blocks K`` asks every request for ``block_schedule:
fixed`` at block size K: the adaptive schedule's block sizes follow each server's measured
costs, and a sampled answer (speculative sampling) depends on where its blocks are cut.
HumanEval chat runs through ``tokenrouter humaneval`` with an
arm per server (``router,router#HOST:PORT``).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from tokenrouter_backend.bench.arm_prompts import NO_REUSE_KNOBS, PREWARM_REQUESTS
from tokenrouter_backend.bench.workloads import CODE_PROMPTS
from tokenrouter_backend.client.triton_client import generate_http

MODES = ("heavy", "light", "verify", "route")
SAMPLINGS = {"greedy": {}, "sampled": {"temperature": 0.8, "top_p": 0.95, "random_seed": 1234}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="HTTP host:port of server A (the earlier commit)")
    parser.add_argument("--b", required=True, help="HTTP host:port of server B (the later commit)")
    parser.add_argument("--prompts", type=int, default=6, help="code prompts (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96, help="per answer (default: %(default)s)")
    parser.add_argument("--samplings", default="greedy,sampled", help="comma list of greedy, sampled")
    parser.add_argument("--fixed-blocks", type=int, default=0,
                        help="block_schedule fixed at this block size (0: the server's schedule, default)")
    parser.add_argument("--out", required=True, help="answers, JSON lines")
    args = parser.parse_args()
    samplings = {name: SAMPLINGS[name] for name in args.samplings.split(",")}
    schedule = {"block_schedule": "fixed", "block_size": args.fixed_blocks} if args.fixed_blocks else {}
    servers = {"A": args.a, "B": args.b}
    totals: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0])  # (mode, sampling, server) -> tokens, s
    same: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])  # (mode, sampling) -> identical, asked
    turn = 0
    with open(args.out, "w") as out:
        for name, prompt in list(CODE_PROMPTS.items())[: args.prompts]:
            for url in servers.values():
                for knobs in PREWARM_REQUESTS:
                    generate_http(url, prompt, **knobs)
            for mode in MODES:
                for sampling, knobs in samplings.items():
                    order = list(servers.items()) if turn % 2 == 0 else list(servers.items())[::-1]
                    turn += 1
                    texts = {}
                    for server, url in order:
                        t0 = time.perf_counter()
                        res = generate_http(url, prompt, max_tokens=args.max_tokens, router_mode=mode,
                                            **NO_REUSE_KNOBS, **knobs, **schedule)
                        elapsed = time.perf_counter() - t0
                        tokens = res.stats["generated_tokens"]
                        totals[(mode, sampling, server)][0] += tokens
                        totals[(mode, sampling, server)][1] += elapsed
                        texts[server] = res.text
                        out.write(json.dumps({"prompt": name, "mode": mode, "sampling": sampling, "server": server,
                                              "tokens": tokens, "latency_s": round(elapsed, 3),
                                              "text": res.text}) + "\n")
                    same[(mode, sampling)][0] += texts["A"] == texts["B"]
                    same[(mode, sampling)][1] += 1
                    print(f"{name:14s} {mode:6s} {sampling:7s} same={texts['A'] == texts['B']}", flush=True)
    print(f"\n{'mode':7s} {'sampling':8s} {'identical':>9s} {'A tok/s':>8s} {'B tok/s':>8s} {'B/A':>6s}")
    for mode in MODES:
        for sampling in samplings:
            a, b = totals[(mode, sampling, "A")], totals[(mode, sampling, "B")]
            ra, rb = a[0] / a[1], b[0] / b[1]
            n, asked = same[(mode, sampling)]
            print(f"{mode:7s} {sampling:8s} {n:>4d}/{asked:<4d} {ra:8.2f} {rb:8.2f} {rb / ra:6.3f}")


if __name__ == "__main__":
    main()
