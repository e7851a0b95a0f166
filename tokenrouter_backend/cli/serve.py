"""`tokenrouter serve`: run tritonserver on a model repository until interrupted, restarting it
when it or a model's Python stub dies (the policy: server/supervisor.py), behind the door that
refuses oversized requests (server/door.py): tritonserver's HTTP and gRPC stay on loopback."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from tokenrouter_backend.branches.heavy_pool import parse_heavy_urls
from tokenrouter_backend.branches.remote import HEAVY_URL_ENV
from tokenrouter_backend.cli.front import add_limit_arguments, front_limits
from tokenrouter_backend.server import paths
from tokenrouter_backend.server.door import DEFAULT_MAX_REQUEST_BYTES, Door, DoorError
from tokenrouter_backend.server.door_http import LIMIT_FLAG
from tokenrouter_backend.server.errors import TritonServerError
from tokenrouter_backend.server.exposure import exposure_warning, server_version
from tokenrouter_backend.server.ports import LOOPBACK
from tokenrouter_backend.server.process import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_SHM_BYTES,
    DEFAULT_SHM_GROWTH_BYTES,
    MIB,
    MODEL_CONTROL_MODES,
    TritonServer,
)
from tokenrouter_backend.server.restrictions import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    RESTRICTED_APIS,
    TRITON_APIS,
    write_key_file,
)
from tokenrouter_backend.server.supervisor import (
    BACKOFF_CAP_S,
    BACKOFF_FLAG,
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_WINDOW_S,
    RESTARTS_FLAG,
    WINDOW_FLAG,
    RestartPolicy,
    Supervisor,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=None,
                        help="model repository (default: the exported demo repository, "
                             "<data>/demo/repository)")
    parser.add_argument("--address", default=LOOPBACK,
                        help=f"address to listen on (default {LOOPBACK}; 0.0.0.0 for all)")
    for name, default in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        parser.add_argument(f"--{name}-port", type=int, default=default,
                            help=f"{name} port (default {default}; 0 = pick a free one)")
    parser.add_argument("--model-control-mode", choices=MODEL_CONTROL_MODES, default="none",
                        help="none: load all at start (default); explicit: load --load-model "
                             "(default all) and allow load/unload over the API")
    parser.add_argument("--load-model", action="append", default=None,
                        help="model to load in explicit mode (repeatable; default '*')")
    parser.add_argument("--shm-bytes", type=int, default=DEFAULT_SHM_BYTES,
                        help="Python-backend shared memory per model instance, bytes "
                             f"(default {DEFAULT_SHM_BYTES // MIB} MiB)")
    parser.add_argument("--shm-growth-bytes", type=int, default=DEFAULT_SHM_GROWTH_BYTES,
                        help=f"its growth step, bytes (default {DEFAULT_SHM_GROWTH_BYTES // MIB} MiB)")
    parser.add_argument("--log-file", type=Path, default=None,
                        help="server log (default <data>/logs/tritonserver-<time>-<pid>.log)")
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose")
    parser.add_argument("--restrict", default=",".join(RESTRICTED_APIS), type=_api_list,
                        help="Triton APIs that need the admin header, comma list (default "
                             f"{','.join(RESTRICTED_APIS)}; 'none' opens all; explicit model "
                             "control needs model-repository); see docs/security.md")
    parser.add_argument("--admin-key-file", type=Path, default=None,
                        help="where the admin key is written, mode 0600 (default "
                             f"<data>/admin.key); the key is ${ADMIN_KEY_ENV} or random")
    parser.add_argument("--heavy-url", action="append", default=None, metavar="HOST:PORT",
                        help="the router's heavy server(s) over gRPC (repeatable or comma list; several = "
                             f"a heavy pool); sets ${HEAVY_URL_ENV}, which overrides the router's heavy_url "
                             "(default: unset, the repository's heavy_url)")
    add_door_arguments(parser)
    add_restart_arguments(parser)
    add_openai_arguments(parser)
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S,
                        help=f"seconds to wait for every model (default {DEFAULT_READY_TIMEOUT_S:.0f})")


def add_door_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the door (request-size limit in front of tritonserver's HTTP and gRPC)")
    group.add_argument(LIMIT_FLAG, type=_request_limit, default=DEFAULT_MAX_REQUEST_BYTES, metavar="BYTES",
                       help="refuse an HTTP body (413) or gRPC message (RESOURCE_EXHAUSTED) larger than this "
                            f"before tritonserver sees it (default {DEFAULT_MAX_REQUEST_BYTES // MIB} MiB; "
                            "see docs/security.md, 'Limits at the door')")
    group.add_argument("--no-door", action="store_true",
                       help="no door: tritonserver itself listens on --address and the ports, with no "
                            "request-size limit (the wheel's tritonserver has none)")


def _request_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, got {text!r}") from None
    if not 1 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"must be in [1, {2**31 - 1}] bytes, got {value}")
    return value


def start_door(args: argparse.Namespace, server: TritonServer) -> Door | None:
    """The door on the user's address and ports in front of the (ready) server; None with --no-door."""
    if args.no_door:
        return None
    return Door(address=args.address, http_port=args.http_port, grpc_port=args.grpc_port,
                upstream_http=server.http_url, upstream_grpc=server.grpc_url,
                max_request_bytes=args.max_request_bytes).start()


def warn_exposure(args: argparse.Namespace, server: TritonServer) -> None:
    """Loudly, on stderr and in the server's log: listening beyond loopback with a vulnerable Triton."""
    text = exposure_warning(args.address, server_version(server.http_url),
                            None if args.no_door else args.max_request_bytes)
    if text is None:
        return
    print(f"tokenrouter serve: {text}", file=sys.stderr, flush=True)
    try:
        with open(server.log_path, "a", encoding="utf-8") as log:
            log.write(f"tokenrouter serve: {text}\n")
    except OSError:
        pass


def add_restart_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("restart policy (when tritonserver or a model's Python stub dies)")
    group.add_argument(RESTARTS_FLAG, type=int, default=DEFAULT_MAX_RESTARTS, metavar="N",
                       help="restart tritonserver on the same ports at most N times within the window "
                            f"(default {DEFAULT_MAX_RESTARTS}; 0 = exit instead, for an outside supervisor)")
    group.add_argument(WINDOW_FLAG, type=float, default=DEFAULT_WINDOW_S, metavar="S",
                       help=f"the sliding window of {RESTARTS_FLAG}, seconds (default {DEFAULT_WINDOW_S:g})")
    group.add_argument(BACKOFF_FLAG, type=float, default=DEFAULT_BACKOFF_S, metavar="S",
                       help=f"wait before the first restart in the window, doubling for each next one, "
                            f"at most {BACKOFF_CAP_S:g} s (default {DEFAULT_BACKOFF_S:g})")


class FrontFailed(Exception):
    """The OpenAI front could not start."""


def add_openai_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("OpenAI-compatible front (off unless --openai-port is given)")
    group.add_argument("--openai-port", type=int, default=None,
                       help="serve /v1/models, /v1/completions, /v1/chat/completions on this port "
                            "(0 = pick a free one; default: off)")
    group.add_argument("--openai-address", default=LOOPBACK,
                       help=f"address the OpenAI front listens on (default {LOOPBACK}; 0.0.0.0 for all)")
    group.add_argument("--chat-template", type=Path, default=None,
                       help="Jinja chat template file replacing the exported tokenizer's "
                            "(default: the tokenizer's own, preprocessing/1/tokenizer)")
    group.add_argument("--chat-special-tokens", action="store_true",
                       help="parse special-token text inside chat message contents as control tokens (the old, unsafe "
                       "behaviour: a user can forge turns; default: kept as text)")
    add_limit_arguments(group, prefix="openai-")


def start_openai_front(args: argparse.Namespace, repository: Path, grpc_url: str):
    """The OpenAI front on ``--openai-port`` (None when not asked for)."""
    if args.openai_port is None:
        return None
    from tokenrouter_backend.openai_front.app import FrontConfig
    from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
    from tokenrouter_backend.openai_front.runner import FrontStartError, OpenAIFront

    tokenizer = Path(repository) / TOKENIZER_DIR
    try:
        config = FrontConfig(grpc_url, tokenizer if tokenizer.is_dir() else None, args.chat_template,
                             limits=front_limits(args, prefix="openai_"),
                             chat_special_tokens=args.chat_special_tokens)
        return OpenAIFront(config, host=args.openai_address, port=args.openai_port).start()
    except (FrontStartError, ValueError) as err:
        raise FrontFailed(str(err)) from err


def _api_list(text: str) -> tuple[str, ...]:
    apis = tuple(a.strip() for a in text.split(",") if a.strip())
    if apis == ("none",):
        return ()
    unknown = [a for a in apis if a not in TRITON_APIS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown API(s) {unknown}; known: {', '.join(TRITON_APIS)}, or none")
    return apis


def run(args: argparse.Namespace) -> int:
    repository = args.repository or paths.demo_repository()
    if not Path(repository).is_dir():
        print(f"tokenrouter serve: model repository not found: {repository}\n"
              "  (export one with `tokenrouter export ...`, or pass --repository)", file=sys.stderr)
        return 2
    port = lambda p: None if p == 0 else p  # noqa: E731
    try:
        policy = RestartPolicy(args.restarts, args.restart_window_s, args.restart_backoff_s)
        if args.heavy_url:
            os.environ[HEAVY_URL_ENV] = ",".join(parse_heavy_urls(",".join(args.heavy_url)))
        door_on = not args.no_door  # the door takes the user's HTTP/gRPC address and ports
        server = TritonServer(repository, http_port=None if door_on else port(args.http_port),
                              grpc_port=None if door_on else port(args.grpc_port),
                              metrics_port=port(args.metrics_port),
                              address=LOOPBACK if door_on else args.address, metrics_address=args.address,
                              model_control_mode=args.model_control_mode, load_models=args.load_model,
                              shm_default_bytes=args.shm_bytes, shm_growth_bytes=args.shm_growth_bytes,
                              log_path=args.log_file, log_verbose=args.log_verbose,
                              ready_timeout_s=args.ready_timeout, restricted_apis=args.restrict)
    except ValueError as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 2
    restricted = _announce_restriction(server, args.admin_key_file or paths.data_dir() / "admin.key")
    stop_requested = threading.Event()
    serving = threading.Event()
    front = door = None

    def on_signal(signum, _frame):
        stop_requested.set()
        if not serving.is_set():  # still loading models: abandon the wait at once
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"tokenrouter serve: starting tritonserver on {repository} (log: {server.log_path})",
              flush=True)
        server.start()
        server.wait_ready()
        door = start_door(args, server)
        public = door or server
        warn_exposure(args, server)
        front = start_openai_front(args, repository, server.grpc_url)
        print(f"ready\n  HTTP    {public.http_url}\n  gRPC    {public.grpc_url}\n"
              f"  metrics {server.metrics_url}" + (f"\n  OpenAI  {front.url}" if front else "")
              + (f"\n  heavy   {os.environ[HEAVY_URL_ENV]}" if args.heavy_url else "")
              + (f"\n  door    requests over {door.limit} bytes refused ({LIMIT_FLAG})" if door
                 else "\n  door    off (--no-door): no request-size limit")
              + f"\n  {restricted}", flush=True)
        code = Supervisor(server, policy, stop_requested, serving=serving,
                          endpoints=lambda: f"HTTP {public.http_url}, gRPC {public.grpc_url}").watch(
            lambda: _front_stopped(front) or _door_stopped(door))
        if code == 0:
            print("tokenrouter serve: stopping", flush=True)
        return code
    except TritonServerError as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 1
    except (FrontFailed, DoorError) as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tokenrouter serve: interrupted while loading; stopping", file=sys.stderr)
        return 130
    finally:
        if front is not None:
            front.stop()
        if door is not None:
            door.stop()
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _front_stopped(front) -> str | None:
    return None if front is None or front.is_running() else "the OpenAI front stopped; stopping"


def _door_stopped(door: Door | None) -> str | None:
    return None if door is None or door.is_running() else "the door stopped; stopping"


def _announce_restriction(server: TritonServer, key_file: Path) -> str:
    """Write the admin key file; the line `serve` prints about it (never the key itself)."""
    restriction = server.restriction
    if not restriction.apis:
        return "admin APIs: all open (--restrict none)"
    write_key_file(key_file, restriction.key)
    return (f"admin APIs ({', '.join(restriction.apis)}) need the header "
            f"{ADMIN_HEADER}: <the key in {key_file}>")
