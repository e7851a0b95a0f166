#!/usr/bin/env python
"""Verify's log-probabilities against heavy-only's on a served pair (issue: logprobs).

    .venv/bin/python research/studies/logprobs_identity.py --url 127.0.0.1:HTTP_PORT --out OUT

Eight held-out prompts (four code, two structured, two text from the bench's workloads),
64 new tokens each, greedy, answer cache off, top 5 alternatives. Per prompt, in turn:
heavy-only with log-probabilities, verify with, route with, and verify without (the cost of
asking: a ratio of verify's own times, the same prompt prewarmed by the first arm for all).
Reports the token identity of verify with heavy-only, the largest absolute difference of
their log-probabilities (and of the top-5 numbers where the ids agree), route's share of
light-model numbers, and verify's time with / without log-probabilities.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from tokenrouter_backend.bench.workloads import CODE_PROMPTS, STRUCTURED_PROMPTS, TEXT_PROMPTS
from tokenrouter_backend.client.triton_client import generate_http


def prompts() -> list[tuple[str, str]]:
    picks = list(CODE_PROMPTS.items())[:4] + list(STRUCTURED_PROMPTS.items())[:2] + list(TEXT_PROMPTS.items())[:2]
    return [(name, text) for name, text in picks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="host:port of the server's HTTP endpoint")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    common = {"max_tokens": args.max_tokens, "answer_cache": False, "temperature": 0.0}
    asked = {"return_log_probs": True, "top_log_probs": 5}
    rows = []
    for name, text in prompts():
        heavy = generate_http(args.url, text, router_mode="heavy", **common, **asked)
        verify = generate_http(args.url, text, router_mode="verify", **common, **asked)
        route = generate_http(args.url, text, router_mode="route", **common, **asked)
        plain = generate_http(args.url, text, router_mode="verify", **common)
        h, v = heavy.logprobs, verify.logprobs
        same = verify.text == heavy.text and len(v.log_probs) == len(h.log_probs)
        diff = float(np.max(np.abs(np.subtract(v.log_probs, h.log_probs)))) if same else float("nan")
        top_diff = max((abs(a[1] - b[1]) for ta, tb in zip(v.top, h.top) for a, b in zip(ta, tb) if a[0] == b[0]),
                       default=0.0) if same else float("nan")
        rows.append({"prompt": name, "tokens": len(h.log_probs), "identical": same, "max_abs_diff": diff,
                     "top5_max_abs_diff": top_diff, "verify_branches": sorted(set(v.branches)),
                     "route_light_share": route.logprobs.branches.count("light") / max(1, len(route.logprobs.branches)),
                     "verify_s": verify.latency_s, "verify_plain_s": plain.latency_s,
                     "verify_plain_identical": plain.text == verify.text})
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        "prompts": len(rows), "identical": sum(r["identical"] for r in rows),
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
        "top5_max_abs_diff": max(r["top5_max_abs_diff"] for r in rows),
        "route_light_share_mean": statistics.mean(r["route_light_share"] for r in rows),
        "verify_time_with_over_without_median": statistics.median(r["verify_s"] / r["verify_plain_s"] for r in rows),
    }
    print(json.dumps(summary))
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
