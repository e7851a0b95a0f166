"""The stub watchdog's command line: its own options, and what it reads from tritonserver's.

``[--poll-s S] [--ready-timeout-s S] -- tritonserver ARGS...``: from ARGS it takes the HTTP
endpoint it probes (``--http-address``, default ``0.0.0.0`` -> probed on 127.0.0.1;
``--http-port``, default 8000), Triton's graceful-stop time (``--exit-timeout-secs``,
default 30) and the Python backend's shared-memory prefix
(``--backend-config=python,shm-region-prefix-name=``, default
``triton_python_backend_shm_region_``). Both ``--flag=value`` and ``--flag value`` count;
the last one wins, as in tritonserver. Bad values exit with `EXIT_USAGE` naming the flag.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

EXIT_USAGE = 2
DEFAULT_POLL_S = 2.0
MAX_POLL_S = 60.0
DEFAULT_READY_TIMEOUT_S = 0.0     # 0: wait as long as it takes (the container's probes decide)
MAX_READY_TIMEOUT_S = 86400.0
TRITON_HTTP_PORT = 8000           # tritonserver's defaults
TRITON_HTTP_ADDRESS = "0.0.0.0"
TRITON_EXIT_TIMEOUT_S = 30
TRITON_SHM_PREFIX = "triton_python_backend_shm_region_"
SHM_PREFIX_CONFIG = "python,shm-region-prefix-name="


@dataclass(frozen=True)
class WatchOptions:
    command: list[str]
    poll_s: float = DEFAULT_POLL_S
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    http_url: str = f"http://127.0.0.1:{TRITON_HTTP_PORT}"
    exit_timeout_s: int = TRITON_EXIT_TIMEOUT_S
    shm_prefix: str = TRITON_SHM_PREFIX


def flag_values(args: list[str], flag: str) -> list[str]:
    """Every value given to ``flag`` in ``args`` (``--flag=v`` or ``--flag v``), in order."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            values.append(arg[len(flag) + 1:])
        elif arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def server_settings(command: list[str]) -> dict:
    """http_url, exit_timeout_s and shm_prefix of a tritonserver command; ValueError naming the flag."""
    args = command[1:]
    if (flag_values(args, "--allow-http") or ["true"])[-1].lower() in ("false", "0", "no", "off"):
        raise ValueError("--allow-http=false: the watchdog needs tritonserver's HTTP endpoint for readiness")
    port_text = (flag_values(args, "--http-port") or [str(TRITON_HTTP_PORT)])[-1]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"--http-port must be an integer in [1, 65535], got {port_text!r}")
    address = (flag_values(args, "--http-address") or [TRITON_HTTP_ADDRESS])[-1]
    host = "127.0.0.1" if address in ("0.0.0.0", "") else ("::1" if address == "::" else address)
    if ":" in host:
        host = f"[{host}]"
    exit_text = (flag_values(args, "--exit-timeout-secs") or [str(TRITON_EXIT_TIMEOUT_S)])[-1]
    if not exit_text.isdigit():
        raise ValueError(f"--exit-timeout-secs must be an integer >= 0, got {exit_text!r}")
    prefixes = [v[len(SHM_PREFIX_CONFIG):] for v in flag_values(args, "--backend-config")
                if v.startswith(SHM_PREFIX_CONFIG)]
    return {"http_url": f"http://{host}:{int(port_text)}", "exit_timeout_s": int(exit_text),
            "shm_prefix": (prefixes or [TRITON_SHM_PREFIX])[-1]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m tokenrouter_backend.server.stub_watch",
        usage="%(prog)s [--poll-s S] [--ready-timeout-s S] -- tritonserver ARGS...",
        description="Run tritonserver; exit 3 when one of its Python stubs dies "
                    "(docs/deployment.md, 'The stub watchdog').")
    parser.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S,
                        help=f"seconds between checks of the stubs, (0, {MAX_POLL_S:g}] "
                             f"(default {DEFAULT_POLL_S:g})")
    parser.add_argument("--ready-timeout-s", type=float, default=DEFAULT_READY_TIMEOUT_S,
                        help=f"exit 4 if tritonserver is not ready after this many seconds, "
                             f"[0, {MAX_READY_TIMEOUT_S:g}]; 0 = no limit (default)")
    return parser


def parse_args(argv: list[str]) -> WatchOptions:
    """The options; on bad input argparse prints the error and exits with EXIT_USAGE."""
    parser = _parser()
    if "--" not in argv:
        parser.error("give the tritonserver command after '--'")
    split = argv.index("--")
    ns = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no tritonserver command after '--'")
    if not 0 < ns.poll_s <= MAX_POLL_S:
        parser.error(f"--poll-s must be in (0, {MAX_POLL_S:g}] seconds, got {ns.poll_s:g}")
    if not 0 <= ns.ready_timeout_s <= MAX_READY_TIMEOUT_S:
        parser.error(f"--ready-timeout-s must be in [0, {MAX_READY_TIMEOUT_S:g}] seconds, "
                     f"got {ns.ready_timeout_s:g}")
    try:
        settings = server_settings(command)
    except ValueError as err:
        parser.error(f"tritonserver command: {err}")
    return WatchOptions(command=command, poll_s=ns.poll_s, ready_timeout_s=ns.ready_timeout_s, **settings)
