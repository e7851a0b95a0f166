#!/usr/bin/env python
"""Router files side by side on the same verify-mode verdicts (route replay).

    .venv/bin/python research/studies/router_compare.py RECORDS ROUTER [ROUTER ...] [--bars 0.02,0.05,0.1]

For each router file and P(disagree) bar: the share of drafts that would stand unchecked
and the predicted agreement with heavy greedy, with the default class policy
(``router_training.frontier``, what ``train-router`` reports on its held-out split), and
the confidence rule with the class policy on the same verdicts for reference. Used to
compare the demo router before and after it stopped training on the running acceptance
(docs/route_quality.md, "One answer whatever the blocks").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tokenrouter_backend.core.signals.learned_router import LearnedRouter
from tokenrouter_backend.core.signals.route_gate import ClassPolicy
from tokenrouter_backend.learning.router_training import collect_samples, frontier
from tokenrouter_backend.operations.decision_log import read_log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="verify-mode decision records (JSON lines)")
    parser.add_argument("routers", nargs="+", help="router files (tokenrouter-router JSON)")
    parser.add_argument("--bars", default="0.02,0.03,0.05,0.08,0.1,0.15", help="P(disagree) bars")
    args = parser.parse_args()
    bars = tuple(float(b) for b in args.bars.split(","))
    samples = collect_samples(read_log(args.records))
    print(f"{len(samples)} verdicts from {args.records}")
    print(f"{'router':40s} {'bar':>6s} {'unchecked':>10s} {'agreement':>10s}")
    f = None
    for path in args.routers:
        f = frontier(samples, LearnedRouter.load(path), ClassPolicy(), router_grid=bars)
        for bar, p in zip(bars, f.router):
            print(f"{Path(path).name:40s} {bar:6.3f} {p.unchecked_share:10.3f} {p.agreement:10.4f}")
    for p in f.confidence_rules:
        print(f"{'confidence + classes':40s} {p.threshold:6.3f} {p.unchecked_share:10.3f} {p.agreement:10.4f}")


if __name__ == "__main__":
    main()
