"""`tokenrouter humaneval`: HumanEval pass@1 and tokens/s per arm against a running server."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenrouter_backend.bench.humaneval import FORMATS, Arm, rescore
from tokenrouter_backend.bench.humaneval import run as run_problems
from tokenrouter_backend.bench.humaneval_report import markdown, plot_frontier, read_records, summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="localhost:8000", help="HTTP host:port of the server (default: %(default)s)")
    p.add_argument("--arms", default="heavy,route@0.8,router",
                   help="comma list of heavy, light, verify, route@T, router, router@T; +KNOB=true|false "
                        "sets a boolean request input (router+light_copies=false); an arm ending in "
                        "#HOST:PORT runs on that server instead of --url, prompts prewarmed on both (an A/B of "
                        "two servers, e.g. router#localhost:8010) (default: %(default)s)")
    p.add_argument("--formats", default="raw,chat", help=f"comma list of {', '.join(FORMATS)} (default: %(default)s)")
    p.add_argument("--problems", default="0:164", help="task index range START:END (default: all, %(default)s)")
    p.add_argument("--max-tokens", type=int, default=160, help="per answer (default: %(default)s)")
    p.add_argument("--repo", type=Path, default=None,
                   help="model repository: its tokenizer's chat template (needed for the chat format)")
    p.add_argument("--out", type=Path, required=True, help="records file (JSON lines, appended)")
    p.add_argument("--summary-only", action="store_true", help="only print the table of --out's records")
    p.add_argument("--rescore", action="store_true",
                   help="recompute pass@1 of --out's records from their answers with this version's scorer, "
                        "rewrite --out, print the table (no requests)")
    p.add_argument("--plot", type=Path, default=None,
                   help="also write this PNG: pass@1 and exact match with heavy against tokens/s x heavy, per arm")


def _range(text: str) -> slice:
    start, _, end = text.partition(":")
    lo, hi = int(start or 0), int(end or 164)
    if not 0 <= lo < hi <= 164:
        raise ValueError(f"--problems must be START:END within 0:164; got {text!r}")
    return slice(lo, hi)


def run(args: argparse.Namespace) -> int:
    if args.rescore:
        from tokenrouter_backend.bench.workloads import humaneval_problems  # noqa: PLC0415
        records = read_records(args.out)
        changed = rescore(records, humaneval_problems())
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
        print(f"rescored {len(records)} records of {args.out}: {changed} changed")
    elif not args.summary_only:
        try:
            arms = [Arm.parse(a) for a in args.arms.split(",") if a.strip()]
            formats = [f.strip() for f in args.formats.split(",") if f.strip()]
            bad = set(formats) - set(FORMATS)
            if bad:
                raise ValueError(f"--formats: unknown {sorted(bad)}; formats: {', '.join(FORMATS)}")
            problems_slice = _range(args.problems)
        except ValueError as exc:
            print(f"humaneval: {exc}", file=sys.stderr)
            return 2
        render = None
        if "chat" in formats:
            if args.repo is None:
                print("humaneval: the chat format needs --repo (the tokenizer's chat template)", file=sys.stderr)
                return 2
            from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR, ChatTemplate  # noqa: PLC0415
            render = ChatTemplate(args.repo / TOKENIZER_DIR).render
        from tokenrouter_backend.bench.workloads import humaneval_problems  # noqa: PLC0415
        run_problems(args.url, humaneval_problems()[problems_slice], formats, arms, args.max_tokens, render, args.out)
    rows = summary(read_records(args.out))
    print(markdown(rows))
    if args.plot is not None:
        print(f"wrote {args.plot}" if plot_frontier(rows, args.plot) else "no plot: the records have no heavy arm")
    return 0
