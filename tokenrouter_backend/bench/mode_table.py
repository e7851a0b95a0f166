"""Single-stream mode comparison on a running server: tokens/s and routing per mode.

`python -m tokenrouter_backend.bench.mode_table --url HOST:PORT` runs the code-completion prompts of
`tokenrouter_backend.bench.workloads` in heavy, light, verify and route modes, interleaved prompt by prompt,
and prints a markdown table of medians (the figures the serving-path issue asks for).
"""
from __future__ import annotations

import argparse
import statistics
import sys

from tokenrouter_backend.client.triton_client import generate_http

from .workloads import load_workloads

MODES = ("heavy", "light", "verify", "route")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", default="127.0.0.1:8000")
    p.add_argument("--prompts", type=int, default=4, help="code prompts to use")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    prompts = load_workloads(["code"], per_workload=args.prompts)
    rows = {m: [] for m in MODES}
    for prompt in prompts:
        for mode in MODES:
            r = generate_http(args.url, prompt.text, max_tokens=args.max_tokens, router_mode=mode)
            rows[mode].append(r)
            s = r.stats
            print(f"{prompt.id:>12} {mode:>6}: {r.tokens} tok {r.tokens_per_s:6.2f} tok/s light {s['light_share']:.2f} "
                  f"heavy/tok {s['heavy_calls_per_token']:.2f} accepted {s['mean_accepted']:.2f}", file=sys.stderr)
    base = statistics.median(r.tokens_per_s for r in rows["heavy"])
    print("| mode | tok/s (median) | × heavy | light share | heavy calls/token | mean accepted draft "
          "| router overhead |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        def med(f, rs=rows[mode]):
            return statistics.median(f(r) for r in rs)

        tps = med(lambda r: r.tokens_per_s)
        print(f"| {mode} | {tps:.2f} | {tps / base:.2f} | {med(lambda r: r.stats['light_share']):.0%} | "
              f"{med(lambda r: r.stats['heavy_calls_per_token']):.2f} | "
              f"{med(lambda r: r.stats['mean_accepted']):.2f} | "
              f"{med(lambda r: r.stats['router_overhead_ms'] / r.stats['total_ms']):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
