#!/usr/bin/env python
"""Verify's speedup over heavy-only with and without a logit processor, and the cost of
asking for log-probabilities, on a served pair (issue: OpenAI-API extras).

    .venv/bin/python research/studies/processors_speedup.py --url 127.0.0.1:HTTP_PORT --out OUT

Eight held-out prompts (four code, two structured, two text from the bench's workloads),
64 new tokens, greedy, answer cache off. Per prompt, arms interleaved in a rotating order:
heavy-only and verify, each plain, with ``frequency_penalty`` 0.5, and verify with
log-probabilities (top 5). Every prompt is sent once before its timed arms (prewarmed for
all arms alike: the branches' prefix caches hold it). Reports per prompt and as medians:
verify's speedup (heavy time / verify time) with and without the penalty, their ratio,
whether verify matched heavy-only token for token under the penalty, and verify's time with
log-probabilities over without.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tokenrouter_backend.bench.workloads import CODE_PROMPTS, STRUCTURED_PROMPTS, TEXT_PROMPTS
from tokenrouter_backend.client.triton_client import generate_http

ARMS = {
    "heavy": {"router_mode": "heavy"},
    "verify": {"router_mode": "verify"},
    "heavy_fp": {"router_mode": "heavy", "frequency_penalty": 0.5},
    "verify_fp": {"router_mode": "verify", "frequency_penalty": 0.5},
    "verify_lp": {"router_mode": "verify", "return_log_probs": True, "top_log_probs": 5},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = list(CODE_PROMPTS.items())[:4] + list(STRUCTURED_PROMPTS.items())[:2] + list(TEXT_PROMPTS.items())[:2]
    common = {"max_tokens": args.max_tokens, "answer_cache": False, "temperature": 0.0}
    rows = []
    names = list(ARMS)
    for i, (name, text) in enumerate(prompts):
        generate_http(args.url, text, router_mode="heavy", **{**common, "max_tokens": 1})  # prewarm
        order = names[i % len(names):] + names[:i % len(names)]
        got = {arm: generate_http(args.url, text, **common, **ARMS[arm]) for arm in order}
        row = {"prompt": name, "tokens": got["heavy"].stats["generated_tokens"],
               "speedup": got["heavy"].latency_s / got["verify"].latency_s,
               "speedup_fp": got["heavy_fp"].latency_s / got["verify_fp"].latency_s,
               "identical_fp": got["verify_fp"].text == got["heavy_fp"].text,
               "penalty_changed": got["heavy_fp"].text != got["heavy"].text,
               "logprobs_cost": got["verify_lp"].latency_s / got["verify"].latency_s,
               **{f"{arm}_s": round(r.latency_s, 3) for arm, r in got.items()}}
        row["speedup_ratio"] = row["speedup_fp"] / row["speedup"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("speedup", "speedup_fp", "speedup_ratio",
                                                              "logprobs_cost")}
    summary = {"prompts": len(rows), "identical_fp": sum(r["identical_fp"] for r in rows),
               "penalty_changed": sum(r["penalty_changed"] for r in rows),
               **{f"median_{k}": v for k, v in med.items()}}
    print(json.dumps(summary))
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
