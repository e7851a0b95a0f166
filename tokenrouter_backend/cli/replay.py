"""`tokenrouter replay LOG`: the route-mode table predicted from verify-mode decision logs."""
from __future__ import annotations

import argparse
import math

from tokenrouter_backend.operations.decision_log import read_log
from tokenrouter_backend.operations.replay import DEFAULT_GRID, DEFAULT_ROLLBACK, collect, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="decision-log files (JSON lines) from verify mode")
    parser.add_argument("--thresholds", default=",".join(map(str, DEFAULT_GRID)),
                        help="comma-separated confidence thresholds to replay (default: %(default)s)")
    parser.add_argument("--entropy-threshold", type=float, default=math.inf, help="route entropy limit (default: inf)")
    parser.add_argument("--rollback-threshold", type=float, default=DEFAULT_ROLLBACK,
                        help="route rollback threshold (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        grid = [float(x) for x in args.thresholds.split(",") if x.strip()]
    except ValueError:
        print(f"replay: --thresholds must be numbers separated by commas; got {args.thresholds!r}")
        return 2
    records = [r for path in args.logs for r in read_log(path)]
    v = collect(records)
    if not len(v):
        print(f"replay: no verify-mode verdicts in {len(records)} records; collect the log with router_mode=verify")
        return 1
    print(table(v, grid, args.entropy_threshold, args.rollback_threshold))
    return 0
