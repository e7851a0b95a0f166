"""Free TCP ports on loopback for servers started by tests, benchmarks and `tokenrouter serve`.

Automatically chosen ports lie *outside* the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``): a client probing a port inside that range
before the server listens on it can be handed the same port as its own source port and
connect to itself (TCP simultaneous open), reading its own request back as the answer.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
ANY_ADDRESS = ("0.0.0.0", "", "::")  # listen addresses meaning "every interface"

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST_PORT = 10000        # above the well-known and most registered service ports
HIGHEST_PORT = 65535
PICK_ATTEMPTS = 200


def client_host(address: str) -> str:
    """Where a local client reaches a server listening on ``address`` (loopback for "every interface")."""
    return LOOPBACK if address in ANY_ADDRESS else address


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral (client source) port range, inclusive."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL


def candidate_ports(ephemeral: tuple[int, int] | None = None) -> list[int]:
    """Ports in [LOWEST_PORT, HIGHEST_PORT] outside the ephemeral range (may be empty)."""
    low, high = ephemeral or ephemeral_range()
    return [p for p in range(LOWEST_PORT, HIGHEST_PORT + 1) if not low <= p <= high]


def is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK, exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A TCP port free right now on ``host``, outside the ephemeral range where possible.

    Falls back to a kernel-chosen port only when no port outside the range is free.
    """
    candidates = candidate_ports()
    for port in random.sample(candidates, min(PICK_ATTEMPTS, len(candidates))):
        if port not in exclude and is_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host, exclude=set(ports))
        if port not in ports:
            ports.append(port)
    return ports
