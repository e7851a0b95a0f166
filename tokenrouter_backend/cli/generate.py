"""``tokenrouter generate``: send one prompt to a running TokenRouter server and print the answer."""
from __future__ import annotations

import argparse
import json
import sys

from tokenrouter_backend.client.routing_view import coloured, legend
from tokenrouter_backend.client.triton_client import GenerationError, generate_grpc, generate_http
from tokenrouter_backend.core.protocol.names import MODES, SCHEDULES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="text_input; '-' reads standard input")
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--url", default=None, help="host:port (default localhost:8000 http, :8001 grpc)")
    p.add_argument("--stream", action="store_true", help="stream tokens as they become final")
    p.add_argument("--json", action="store_true", help="print text_output and routing stats as JSON")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--mode", dest="router_mode", choices=list(MODES), default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", dest="random_seed", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--block-schedule", choices=list(SCHEDULES), default=None)
    p.add_argument("--confidence-threshold", type=float, default=None)
    p.add_argument("--entropy-threshold", type=float, default=None)
    p.add_argument("--rollback-threshold", type=float, default=None)
    p.add_argument("--rollback-window", type=int, default=None)
    p.add_argument("--draft-confidence-threshold", type=float, default=None)
    p.add_argument("--router-threshold", type=float, default=None,
                   help="route with a learned router: P(heavy would disagree) at or below which a draft stands, "
                        "in [0, 1] (default: the router file's own)")
    p.add_argument("--stop", dest="stop_words", action="append", default=None,
                   help="stop string, matched on the generated text (repeatable)")
    p.add_argument("--end-id", type=int, default=None)
    p.add_argument("--show-routing", action="store_true",
                   help="colour each token by its origin: light unchecked / light verified / heavy / after a rollback")
    p.add_argument("--no-colour", dest="colour", action="store_false",
                   help="with --show-routing: [kind:text] marks instead of terminal colours")


KNOB_ARGS = ("max_tokens", "router_mode", "temperature", "top_k", "top_p", "random_seed", "block_size",
             "block_schedule", "confidence_threshold", "entropy_threshold", "rollback_threshold",
             "rollback_window", "draft_confidence_threshold", "router_threshold", "stop_words", "end_id")


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    knobs = {k: getattr(args, k) for k in KNOB_ARGS}
    if args.protocol == "http" and args.stop_words:
        knobs["stop_words"] = args.stop_words
    if args.show_routing:
        knobs["show_routing"] = True
    try:
        if args.protocol == "http":
            result = generate_http(args.url or "localhost:8000", prompt, stream=args.stream, **knobs)
        else:
            result = generate_grpc(args.url or "localhost:8001", prompt, stream=args.stream, **knobs)
    except GenerationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"text_output": result.text, "routing_stats": result.stats,
                          "ttft_s": round(result.ttft_s, 4), "latency_s": round(result.latency_s, 4)}, indent=2))
    elif args.show_routing:
        runs = result.stats.get("routing")
        if runs is None:
            print("error: the server sent no routing runs (its router has no tokenizer, or predates show_routing)",
                  file=sys.stderr)
            return 1
        print(coloured(runs, args.colour))
        print(legend(runs, args.colour), file=sys.stderr)
    else:
        if args.stream:
            for chunk in result.chunks:
                sys.stdout.write(chunk)
            sys.stdout.write("\n")
        else:
            print(result.text)
        s = result.stats
        print(f"[{s.get('mode')}] {s.get('generated_tokens')} tokens in {result.latency_s:.2f}s "
              f"({result.tokens_per_s:.2f} tok/s), light share {s.get('light_share', 0):.0%}, "
              f"heavy calls {s.get('heavy_calls')}, light calls {s.get('light_calls')}, "
              f"drafts {s.get('drafts_accepted')}/{s.get('drafts_proposed')}, rollbacks {s.get('rollbacks')}",
              file=sys.stderr)
    return 0
