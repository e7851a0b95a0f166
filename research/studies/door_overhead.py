#!/usr/bin/env python
"""What `tokenrouter serve`'s door costs a streaming request: the same requests through the door
and straight to tritonserver's private ports, interleaved.

    .venv/bin/python research/studies/door_overhead.py --repository REPO [--rounds 20] [--max-tokens 128]

Starts `tokenrouter serve` on REPO (free ports; the door on), reads tritonserver's private HTTP
and gRPC ports from its command line, then for each round sends one greedy streaming request
per (protocol, path) — gRPC ``ModelStreamInfer`` and HTTP ``generate_stream``, through the door
and direct — in an order that alternates per round. Prints, per protocol, the medians of the
whole request's latency, the time to the first response, the gap between responses and
tokens/s for both paths, and the door's ratio; writes every measurement to ``--out`` (JSON lines).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from tokenrouter_backend.client.triton_client import generate_grpc, generate_http

PROMPT = "def fibonacci(n):\n    "


def start_serve(repository: Path, log: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter_backend", "serve", "--repository", str(repository),
                             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-file", str(log)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    urls: dict[str, str] = {}
    for line in proc.stdout:
        if m := re.search(r"^  (HTTP|gRPC) +(?:http://)?(\S+)", line):
            urls[m.group(1)] = m.group(2)
        if line.startswith("  admin APIs"):
            break
    pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _is_triton_child(int(p), proc.pid))
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    urls["direct HTTP"] = f"127.0.0.1:{flags['http-port']}"
    urls["direct gRPC"] = f"127.0.0.1:{flags['grpc-port']}"
    return proc, urls


def _is_triton_child(pid: int, parent: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(stat[1]) == parent and Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    except OSError:
        return False


def measure(protocol: str, url: str, max_tokens: int) -> dict:
    knobs = {"max_tokens": max_tokens, "temperature": 0.0, "router_mode": "verify", "answer_cache": False}
    call = generate_grpc if protocol == "gRPC" else generate_http
    result = call(url, PROMPT, stream=True, timeout_s=120, **knobs)
    gaps = result.inter_token_gaps
    return {"latency_s": result.latency_s, "ttft_s": result.ttft_s, "responses": len(result.chunks),
            "gap_s": statistics.median(gaps) if gaps else 0.0, "tokens": result.tokens,
            "tokens_per_s": result.tokens_per_s, "text": result.text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("door_overhead.jsonl"))
    args = parser.parse_args()
    proc, urls = start_serve(args.repository.resolve(), args.out.with_suffix(".serve.log"))
    rows = []
    try:
        for protocol in ("gRPC", "HTTP"):
            for path in ("door", "direct"):  # warm both paths
                measure(protocol, urls[protocol] if path == "door" else urls[f"direct {protocol}"], args.max_tokens)
        for r in range(args.rounds):
            for protocol in ("gRPC", "HTTP"):
                order = ("door", "direct") if r % 2 == 0 else ("direct", "door")
                for path in order:
                    url = urls[protocol] if path == "door" else urls[f"direct {protocol}"]
                    rows.append({"round": r, "protocol": protocol, "path": path,
                                 **measure(protocol, url, args.max_tokens)})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    with args.out.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    texts = {(row["protocol"], row["path"]): row["text"] for row in rows}
    print(f"{args.rounds} rounds, {args.max_tokens} tokens max; same answers door/direct: "
          f"{all(texts[(p, 'door')] == texts[(p, 'direct')] for p in ('gRPC', 'HTTP'))}")
    for protocol in ("gRPC", "HTTP"):
        med = {path: {k: statistics.median(row[k] for row in rows if row["protocol"] == protocol
                                           and row["path"] == path)
                      for k in ("latency_s", "ttft_s", "gap_s", "tokens_per_s", "responses")}
               for path in ("door", "direct")}
        d, x = med["door"], med["direct"]
        print(f"{protocol}: latency {d['latency_s'] * 1e3:.1f} ms door / {x['latency_s'] * 1e3:.1f} ms direct "
              f"(x{d['latency_s'] / x['latency_s']:.3f}); first response {d['ttft_s'] * 1e3:.1f} / "
              f"{x['ttft_s'] * 1e3:.1f} ms; gap between responses {d['gap_s'] * 1e3:.2f} / {x['gap_s'] * 1e3:.2f} ms; "
              f"{d['tokens_per_s']:.0f} / {x['tokens_per_s']:.0f} tokens/s; {d['responses']:.0f} responses")


if __name__ == "__main__":
    main()
