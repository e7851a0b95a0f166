"""``OpenAIFront``: the app under uvicorn in a background thread (``tokenrouter serve`` and tests).

``start()`` returns once the socket listens (port 0 picks a free one: ``port`` then holds
it); ``stop()`` lets uvicorn finish the open requests (at most ``graceful_s``) and joins.
Each connection buffers at most about ``FrontConfig.stream_buffer_bytes`` twice: as its
transport's write high-water mark (uvicorn pauses the sender above it) and as its socket's
``SO_SNDBUF`` (half of it: Linux doubles the value), set on the runner's own listening socket,
which accepted connections inherit, instead of the megabytes the kernel's autotuning would
grant. So a client that stops reading blocks its stream's sends soon, and
``stream_stall_s`` ends the stream (``transport.py``).
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Optional

from .app import FrontConfig, create_app

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 9000
START_TIMEOUT_S = 60.0
GRACEFUL_S = 10.0


def _bounded_h11(high_water: int):
    """uvicorn's h11 protocol with the transport's write high-water mark at ``high_water`` bytes."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        def connection_made(self, transport) -> None:
            transport.set_write_buffer_limits(high=high_water)
            super().connection_made(transport)

    return BoundedH11


class FrontStartError(RuntimeError):
    """The front could not listen (port taken, bad address) or its app failed to start."""


class OpenAIFront:
    def __init__(self, config: FrontConfig, host: str = LOOPBACK, port: int = DEFAULT_PORT,
                 log_level: str = "warning"):
        import uvicorn

        self.config = config
        self.host = host
        self.port = port
        app = create_app(config)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                     http=_bounded_h11(config.stream_buffer_bytes),
                                                     timeout_graceful_shutdown=GRACEFUL_S, lifespan="on"))
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """The OpenAI base URL (what ``openai.OpenAI(base_url=...)`` takes)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "OpenAIFront":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.port), family=family)
        except OSError as exc:
            raise FrontStartError(f"the OpenAI front cannot listen on {self.host}:{self.port}: {exc}") from exc
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.stream_buffer_bytes // 2)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="openai-front",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise FrontStartError(f"the OpenAI front did not start on {self.host}:{self.port} (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise FrontStartError(f"the OpenAI front did not start within {timeout_s:g} s")
            time.sleep(0.05)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(GRACEFUL_S + 5)
        self._thread = None

    def __enter__(self) -> "OpenAIFront":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
