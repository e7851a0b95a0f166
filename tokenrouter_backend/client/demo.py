"""The demo's generation step: code-completion prompts in heavy, verify and route modes.

Prints each answer with its routing stats, then a side-by-side table of tokens/s and the
light model's share of tokens (what `make demo` shows a newcomer).
"""
from __future__ import annotations

import argparse
import sys

from .triton_client import generate_http

DEMO_PROMPTS = (
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards, ignoring case."""\n',
)
DEMO_MODES = ("heavy", "verify", "route")
DEFAULT_MAX_TOKENS = 64


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", default="127.0.0.1:8000", help="HTTP host:port of the server")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    args = p.parse_args(argv)
    rows = []
    for i, prompt in enumerate(DEMO_PROMPTS):
        for mode in DEMO_MODES:
            r = generate_http(args.url, prompt, max_tokens=args.max_tokens, router_mode=mode)
            s = r.stats
            print(f"\n--- prompt {i + 1}, mode {mode}: {r.tokens} tokens, {r.tokens_per_s:.2f} tok/s, "
                  f"light share {s['light_share']:.0%}, heavy calls {s['heavy_calls']}, "
                  f"drafts accepted {s['drafts_accepted']}/{s['drafts_proposed']}, rollbacks {s['rollbacks']}")
            print(prompt + r.text)
            rows.append((i + 1, mode, r.tokens, r.tokens_per_s, s["light_share"], s["heavy_calls_per_token"]))
    print("\n| prompt | mode | tokens | tok/s | light share | heavy calls/token |")
    print("|---|---|---|---|---|---|")
    for prompt_no, mode, tokens, tps, share, hpt in rows:
        print(f"| {prompt_no} | {mode} | {tokens} | {tps:.2f} | {share:.0%} | {hpt:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
