"""`tokenrouter replay LOG`: the route-mode table predicted from verify-mode decision logs;
`--html OUT`: the logged answers as a page, tokens coloured by origin (any mode's logs)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from tokenrouter_backend.learning.replay import DEFAULT_GRID, DEFAULT_ROLLBACK, collect, table
from tokenrouter_backend.operations.decision_log import read_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="decision-log files (JSON lines) from verify mode")
    parser.add_argument("--thresholds", default=",".join(map(str, DEFAULT_GRID)),
                        help="comma-separated confidence thresholds to replay (default: %(default)s)")
    parser.add_argument("--entropy-threshold", type=float, default=math.inf, help="route entropy limit (default: inf)")
    parser.add_argument("--rollback-threshold", type=float, default=DEFAULT_ROLLBACK,
                        help="route rollback threshold (default: %(default)s)")
    parser.add_argument("--html", metavar="OUT", default=None,
                        help="write the logged answers as an HTML page (tokens coloured by origin; hover for details)")
    parser.add_argument("--tokenizer", metavar="PATH", default=None,
                        help="with --html: tokenizer.json, a folder holding one, or a model repository "
                             "(router/1/tokenizer); without it tokens show as ids")


def find_tokenizer_file(path: str) -> Path:
    p = Path(path)
    for candidate in (p, p / "tokenizer.json", p / "tokenizer" / "tokenizer.json",
                      p / "router" / "1" / "tokenizer" / "tokenizer.json"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no tokenizer.json at {path} (nor in tokenizer/ or router/1/tokenizer/ below it)")


def write_html(records, out: str, tokenizer: str | None) -> int:
    from tokenrouter_backend.learning.replay_html import render  # noqa: PLC0415 - only with --html

    decode = None
    if tokenizer:
        from tokenizers import Tokenizer  # noqa: PLC0415

        try:
            tok = Tokenizer.from_file(str(find_tokenizer_file(tokenizer)))
        except Exception as exc:  # noqa: BLE001 - any load failure names the user's path
            print(f"replay: --tokenizer: {exc}")
            return 2
        decode = lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)  # noqa: E731
    Path(out).write_text(render(records, decode), encoding="utf-8")
    print(f"replay: wrote {out} ({len(records)} blocks)")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        grid = [float(x) for x in args.thresholds.split(",") if x.strip()]
    except ValueError:
        print(f"replay: --thresholds must be numbers separated by commas; got {args.thresholds!r}")
        return 2
    records = [r for path in args.logs for r in read_log(path)]
    if args.html:
        return write_html(records, args.html, args.tokenizer)
    v = collect(records)
    if not len(v):
        print(f"replay: no verify-mode verdicts in {len(records)} records; collect the log with router_mode=verify")
        return 1
    print(table(v, grid, args.entropy_threshold, args.rollback_threshold))
    return 0
