"""The door: `tokenrouter serve`'s size limit in front of tritonserver's HTTP and gRPC ports.

The wheel's tritonserver (2.51) has no request-size option: its gRPC server takes messages up
to 2 GiB and its HTTP front any body, chunked included, so every cap inside the models runs
after Triton received and copied the whole request. With the door, tritonserver listens on
private loopback ports and `Door` listens on the user's address and ports: HTTP through
``door_http.py``, gRPC through ``door_grpc.py``, both on one asyncio loop in a background
thread, both refusing anything over ``max_request_bytes`` before it reaches tritonserver.
The metrics port needs no door (Prometheus text, GET only, no request bodies).
"""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from tokenrouter_backend.server import door_grpc, door_http
from tokenrouter_backend.server.ports import client_host, free_port

MIB = 1024 * 1024
# The largest legitimate request: a 1 MiB `text_input` (preprocessing's max_input_bytes) even
# with every byte JSON-escaped as \u00XX (6 MiB), 16 stop words of 256 characters (<= 24 KiB
# escaped) and the other parameters (< 1 KiB); 8 MiB holds it with room to spare. Over gRPC
# or Triton's binary tensors the same request is about 1 MiB.
DEFAULT_MAX_REQUEST_BYTES = 8 * MIB
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


class DoorError(RuntimeError):
    """The door could not listen (port taken, bad address)."""


class Door:
    """HTTP on ``http_port`` → ``upstream_http`` (a URL), gRPC on ``grpc_port`` →
    ``upstream_grpc`` (host:port); requests over ``max_request_bytes`` refused. Port 0 picks a
    free one (`http_port` / `grpc_port` hold it after `start`)."""

    def __init__(self, *, address: str, http_port: int, grpc_port: int, upstream_http: str,
                 upstream_grpc: str, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        if max_request_bytes < 1 or max_request_bytes > 2**31 - 1:
            raise ValueError(f"{door_http.LIMIT_FLAG} must be in [1, {2**31 - 1}] bytes, "
                             f"got {max_request_bytes}")
        self.address = address
        self.http_port = http_port or free_port(_bind_host(address))
        self.grpc_port = grpc_port or free_port(_bind_host(address), exclude={self.http_port})
        self.upstream_http, self.upstream_grpc = upstream_http, upstream_grpc
        self.limit = max_request_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def _client_host(self) -> str:
        return client_host(self.address)

    @property
    def http_url(self) -> str:
        return f"http://{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "Door":
        """Listen on both ports (returns once both listen; `DoorError` if they cannot)."""
        self._thread = threading.Thread(target=self._run, name="door", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            self.stop()
            raise DoorError(f"the door could not listen on {self.address} (HTTP {self.http_port}, "
                            f"gRPC {self.grpc_port}): {self._error or 'timed out'}")
        return self

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(STOP_GRACE_S + 5)
        self._thread = None

    def __enter__(self) -> "Door":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # noqa: BLE001 - reported by start(), the thread ends
            self._error = self._error or err
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        runner = web.AppRunner(door_http.create_app(self.upstream_http, self.limit), handle_signals=False,
                               access_log=None, lingering_time=0)  # door_http lingers without reading
        await runner.setup()
        grpc_server = channel = None
        try:
            await web.TCPSite(runner, _bind_host(self.address), self.http_port).start()
            grpc_server, channel, _ = await door_grpc.start_server(
                self.upstream_grpc, _bind_host(self.address), self.grpc_port, self.limit)
            self._started.set()
            await self._stopping.wait()
        except OSError as err:
            self._error = err
            self._started.set()
        finally:
            if grpc_server is not None:
                await grpc_server.stop(STOP_GRACE_S)
            if channel is not None:
                await channel.close()
            await runner.cleanup()


def _bind_host(address: str) -> str:
    return address or "0.0.0.0"
