"""Readiness probes never raise, and automatic ports avoid the self-connect case."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tokenrouter_backend.server import ports
from tokenrouter_backend.server.probe import http_status
from tokenrouter_backend.server.process import TritonServer


class RawServer:
    """A loopback TCP server answering every connection with ``reply(request_bytes)``."""

    def __init__(self, reply):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((ports.LOOPBACK, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                answer = self.reply(request)
                if answer:
                    conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def make(reply) -> RawServer:
        servers.append(RawServer(reply))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


# what each answer makes http.client raise: BadStatusLine (our own request echoed back, as in
# a TCP self-connect), BadStatusLine (garbage), RemoteDisconnected (closed without answer),
# LineTooLong (an endless status line)
NON_HTTP_ANSWERS = {
    "echo": lambda request: request,
    "garbage": lambda request: b"\x00\xffnot http at all\r\n\r\n",
    "closed": lambda request: b"",
    "endless_status_line": lambda request: b"HTTP/1.1 200 " + b"x" * 100_000,
}


@pytest.mark.parametrize("answer", sorted(NON_HTTP_ANSWERS))
def test_probe_reads_non_http_answer_as_not_ready(raw_server, answer):
    server = raw_server(NON_HTTP_ANSWERS[answer])
    assert http_status(f"http://{ports.LOOPBACK}:{server.port}/v2/health/ready", 2.0) is None


def test_probe_reports_http_status_codes(raw_server):
    ok = raw_server(lambda r: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    unavailable = raw_server(lambda r: b"HTTP/1.1 503 No\r\nContent-Length: 0\r\n\r\n")
    assert http_status(f"http://{ports.LOOPBACK}:{ok.port}/", 2.0) == 200
    assert http_status(f"http://{ports.LOOPBACK}:{unavailable.port}/", 2.0) == 503


def test_probe_of_closed_port_and_bad_url_is_not_ready():
    closed = ports.free_port()
    assert http_status(f"http://{ports.LOOPBACK}:{closed}/", 1.0) is None
    assert http_status("http://[bad", 1.0) is None


def test_is_ready_survives_an_echoing_port(raw_server, tmp_path: Path):
    """The launcher's own readiness query on a port that echoes requests (self-connect)."""
    echo = raw_server(NON_HTTP_ANSWERS["echo"])
    server = TritonServer(tmp_path, http_port=echo.port, grpc_port=1, metrics_port=2,
                          log_path=tmp_path / "x.log")
    assert server.is_ready() is False


def test_automatic_ports_lie_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    picked = ports.free_ports(30)
    assert len(set(picked)) == 30
    assert all(not low <= p <= high for p in picked), (low, high, picked)
    assert all(ports.LOWEST_PORT <= p <= ports.HIGHEST_PORT for p in picked)
    server = TritonServer(Path("."))
    assert all(not low <= p <= high
               for p in (server.http_port, server.grpc_port, server.metrics_port))


def test_ephemeral_range_file_parsing(tmp_path: Path):
    f = tmp_path / "range"
    f.write_text("20000\t50000\n")
    assert ports.ephemeral_range(f) == (20000, 50000)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.LINUX_DEFAULT_EPHEMERAL
    every = ports.candidate_ports((1024, 65535))
    assert every == []  # the whole range is ephemeral: free_port falls back to the kernel
    assert ports.candidate_ports((32768, 60999))[0] == ports.LOWEST_PORT
