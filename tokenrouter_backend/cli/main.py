"""The `tokenrouter` command: a table of subcommands, each in its own module, imported lazily.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Only the module of
the subcommand being run is imported, so a missing optional dependency (or a subcommand
not written yet) breaks only that subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Sequence

from tokenrouter_backend import __version__

EXIT_USAGE = 2


@dataclass(frozen=True)
class Subcommand:
    name: str
    module: str
    help: str


SUBCOMMANDS = (
    Subcommand("serve", "tokenrouter_backend.cli.serve",
               "run tritonserver on a model repository (default: the exported demo pair)"),
    Subcommand("openai", "tokenrouter_backend.cli.front",
               "the OpenAI-compatible front alone, against a running tritonserver"),
    Subcommand("models", "tokenrouter_backend.cli.models",
               "get model pairs: fetch-demo (Qwen2.5-Coder GGUFs), tiny (test pair)"),
    Subcommand("export", "tokenrouter_backend.export.pipeline",
               "heavy/light pair (HF folder or GGUF) -> servable Triton model repository"),
    Subcommand("generate", "tokenrouter_backend.cli.generate", "send a generation request to a running server"),
    Subcommand("bench", "tokenrouter_backend.bench.bench", "benchmark a running server"),
    Subcommand("replay", "tokenrouter_backend.cli.replay", "replay recorded requests"),
    Subcommand("humaneval", "tokenrouter_backend.cli.humaneval",
               "HumanEval pass@1 and tokens/s per arm (raw and chat formats) against a running server"),
    Subcommand("train-router", "tokenrouter_backend.cli.train_router",
               "train the learned router (route mode) on verify-mode decision logs"),
)


def build_parser(selected: str | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser; only ``selected``'s module is imported to add its arguments.

    Returns the parser and {name: module or ImportError} for the imported subcommand.
    """
    parser = argparse.ArgumentParser(prog="tokenrouter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tokenrouter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    loaded: dict = {}
    for cmd in SUBCOMMANDS:
        sub_parser = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.name != selected:
            continue
        try:
            module = importlib.import_module(cmd.module)
        except ImportError as err:
            loaded[cmd.name] = err
            continue
        module.add_arguments(sub_parser)
        loaded[cmd.name] = module
    return parser, loaded


def _selected(argv: Sequence[str]) -> str | None:
    names = {cmd.name for cmd in SUBCOMMANDS}
    return next((arg for arg in argv if arg in names), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = _selected(argv)
    parser, loaded = build_parser(selected)
    if isinstance(loaded.get(selected), ImportError):  # before parsing: its options are unknown
        spec = next(c for c in SUBCOMMANDS if c.name == selected)
        print(f"tokenrouter {selected}: unavailable — cannot import {spec.module}: "
              f"{loaded[selected]}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    return int(loaded[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
