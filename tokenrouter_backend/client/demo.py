"""The demo's generation step: code-completion prompts in heavy, verify and route modes.

Prints each answer with its routing stats, then a side-by-side table of tokens/s and the
light model's share of tokens (what `make demo` shows a newcomer); with ``--openai-url``,
then one chat answer of the Instruct model through the OpenAI-compatible endpoint.
"""
from __future__ import annotations

import argparse
import sys
import time

from .triton_client import generate_http

DEMO_PROMPTS = (
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards, ignoring case."""\n',
)
DEMO_MODES = ("heavy", "verify", "route")
DEFAULT_MAX_TOKENS = 64
CHAT_QUESTION = "In one sentence: what does a Python list comprehension do?"
CHAT_MAX_TOKENS = 64
CHAT_MODE = "verify"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", default="127.0.0.1:8000", help="HTTP host:port of the server")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--openai-url", default=None,
                   help="base URL of the OpenAI-compatible front (http://host:port/v1): also ask one chat question")
    args = p.parse_args(argv)
    rows = []
    for i, prompt in enumerate(DEMO_PROMPTS):
        for mode in DEMO_MODES:
            # the modes answer the same prompt: with the decision cache, verify would copy heavy's answer
            r = generate_http(args.url, prompt, max_tokens=args.max_tokens, router_mode=mode, answer_cache=False)
            s = r.stats
            print(f"\n=== prompt {i + 1}, mode {mode}: {r.tokens} tokens, {r.tokens_per_s:.2f} tok/s, "
                  f"light share {s['light_share']:.0%}, heavy calls {s['heavy_calls']}, "
                  f"drafts accepted {s['drafts_accepted']}/{s['drafts_proposed']}, rollbacks {s['rollbacks']}")
            print(answer_block(prompt, r.text))
            rows.append((i + 1, mode, r.tokens, r.tokens_per_s, s["light_share"], s["heavy_calls_per_token"]))
    print("\n" + summary_table(rows))
    if args.openai_url:
        print("\n" + chat_demo(args.openai_url))
    return 0


def chat_demo(base_url: str, question: str = CHAT_QUESTION) -> str:
    """One chat answer through POST /v1/chat/completions (the model's chat template applies)."""
    import requests

    body = {"model": "tokenrouter", "messages": [{"role": "user", "content": question}],
            "max_completion_tokens": CHAT_MAX_TOKENS, "router_mode": CHAT_MODE}
    start = time.perf_counter()
    resp = requests.post(f"{base_url.rstrip('/')}/chat/completions", json=body, timeout=600)
    data = resp.json()
    if resp.status_code != 200:
        raise RuntimeError(f"chat request failed ({resp.status_code}): {data.get('error', data)}")
    seconds = time.perf_counter() - start
    answer, usage, stats = data["choices"][0]["message"]["content"], data["usage"], data["routing_stats"]
    return (f"=== chat through the OpenAI endpoint ({CHAT_MODE}): {usage['completion_tokens']} tokens in "
            f"{seconds:.1f} s, finish_reason {data['choices'][0]['finish_reason']}, "
            f"light share {stats['light_share']:.0%}\n"
            f"  user      | {question}\n" + "\n".join(f"  assistant | {line}" for line in answer.strip().split("\n")))


def answer_block(prompt: str, completion: str) -> str:
    """The prompt and its completion, each line behind a margin so the answer stands out."""
    return "\n".join(f"  | {line}" for line in (prompt + completion).rstrip("\n").split("\n"))


TABLE_HEADER = ("prompt", "mode", "tokens", "tok/s", "light share", "heavy calls/token")


def summary_table(rows: list[tuple]) -> str:
    """Aligned text table of (prompt, mode, tokens, tok/s, light share, heavy calls/token) rows."""
    cells = [TABLE_HEADER] + [(str(n), mode, str(tokens), f"{tps:.2f}", f"{share:.0%}", f"{hpt:.2f}")
                              for n, mode, tokens, tps, share, hpt in rows]
    widths = [max(len(row[c]) for row in cells) for c in range(len(TABLE_HEADER))]
    lines = ["  ".join(cell.rjust(w) if c != 1 else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths)))
             for row in cells]
    rule = "-" * len(lines[0])
    return "\n".join(["=== summary: tokens/s and the light model's share of the tokens, per mode",
                      lines[0], rule, *lines[1:]])

if __name__ == "__main__":
    sys.exit(main())
