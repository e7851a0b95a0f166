"""`tokenrouter openai`: the OpenAI-compatible front alone, against a running tritonserver
(a sidecar beside Triton in a pod; `tokenrouter serve --openai-port` runs both in one process)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tokenrouter_backend.server.ports import LOOPBACK

DEFAULT_PORT = 9000
POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--triton-grpc", default=f"{LOOPBACK}:8001",
                        help=f"gRPC host:port of the server holding the ensemble (default {LOOPBACK}:8001)")
    parser.add_argument("--repository", type=Path, default=None,
                        help="the model repository (its preprocessing/1/tokenizer gives the chat template); "
                             "default: no chat template")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = free)")
    parser.add_argument("--address", default=LOOPBACK, help=f"address (default {LOOPBACK}; 0.0.0.0 for all)")
    parser.add_argument("--chat-template", type=Path, default=None,
                        help="Jinja chat template file replacing the exported tokenizer's")
    parser.add_argument("--chat-special-tokens", action="store_true",
                        help="parse special-token text inside chat message contents as control tokens (the old, unsafe "
                        "behaviour: a user can forge turns; default: kept as text)")
    add_limit_arguments(parser)


def add_limit_arguments(parser, prefix: str = "") -> None:
    """The front's request limits (``--max-body-bytes``; ``serve`` prefixes them with ``openai-``)."""
    parser.add_argument(f"--{prefix}max-body-bytes", type=int, default=None,
                        help="largest request body; a larger one is refused 413 before it is read "
                             "(default 8 MiB: a 1 MiB prompt in JSON's worst escaping)")
    parser.add_argument(f"--{prefix}max-prompt-bytes", type=int, default=None,
                        help="largest prompt, or all chat messages' text, in UTF-8 bytes (default 1 MiB, "
                             "the server's max_input_bytes)")
    parser.add_argument(f"--{prefix}max-prompts", type=int, default=None,
                        help="most prompts one completion may hold (a list `prompt`; each is generated as a "
                             "request of its own; default 64)")


def front_limits(args: argparse.Namespace, prefix: str = ""):
    """``Limits`` from the options ``add_limit_arguments`` added (the defaults where not given)."""
    from tokenrouter_backend.openai_front.parsing import Limits

    given = {name: getattr(args, f"{prefix}{name}") for name in ("max_body_bytes", "max_prompt_bytes",
                                                                      "max_prompts")}
    return Limits(**{name: value for name, value in given.items() if value is not None})


def run(args: argparse.Namespace) -> int:
    from tokenrouter_backend.openai_front.app import FrontConfig
    from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
    from tokenrouter_backend.openai_front.runner import FrontStartError, OpenAIFront

    tokenizer = args.repository / TOKENIZER_DIR if args.repository else None
    if tokenizer is not None and not tokenizer.is_dir():
        print(f"tokenrouter openai: no tokenizer at {tokenizer}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        limits = front_limits(args)
    except ValueError as err:
        print(f"tokenrouter openai: {err}", file=sys.stderr)
        return 2
    front = OpenAIFront(FrontConfig(args.triton_grpc, tokenizer, args.chat_template, limits=limits,
                                    chat_special_tokens=args.chat_special_tokens),
                        host=args.address, port=args.port)
    try:
        front.start()
        print(f"ready\n  OpenAI  {front.url}  (Triton gRPC {args.triton_grpc})", flush=True)
        while not stop.wait(POLL_S):
            if not front.is_running():
                print("tokenrouter openai: the front stopped", file=sys.stderr)
                return 1
        return 0
    except FrontStartError as err:
        print(f"tokenrouter openai: {err}", file=sys.stderr)
        return 1
    finally:
        front.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
