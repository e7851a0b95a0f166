"""``RemoteBranch``: a branch model (heavy or light) served by another Triton server, over gRPC.

The router uses it instead of in-process BLS when its ``heavy_url`` parameter (or the
``TOKENROUTER_HEAVY_URL`` environment variable, see ``resolve_heavy_url``) names a server.
Tensors follow ``branch_protocol`` exactly, so the remote model is the same ``heavy`` model
that BLS would call.

Failure handling:
- every call has a deadline (``timeout_s``); a call past it fails with ``BranchTimeout``;
- a server that cannot be reached (gRPC UNAVAILABLE) is retried ``connect_retries`` times
  with exponential backoff, each retry on a fresh channel (the old one is closed when the
  last call using it ends, never under concurrent calls), then fails with a ``BranchError``
  naming the URL and model (``ServerUnreachable``, which ``heavy_pool`` reads as the server
  gone). Retrying a step is safe even if the server did run it: a step
  first truncates the session to ``keep_len``, so running it twice leaves the same cache;
- a remote error whose message reports a missing session (``branch_protocol.is_session_missing``)
  becomes ``SessionMissing``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import (
    TENSOR_INPUTS,
    TENSOR_OUTPUTS,
    BranchError,
    BranchOp,
    BranchResult,
    BranchTimeout,
    BranchUnreachable,
    SessionMissing,
    is_session_missing,
    op_to_arrays,
    result_from_arrays,
)

# outputs a branch of an older repository may lack (``result_from_arrays`` defaults them)
OPTIONAL_OUTPUTS = frozenset(TENSOR_OUTPUTS[k] for k in ("dist", "forward_tokens", "forwards", "reused_tokens",
                                                           "margin", "lone_steps", "token_logprobs",
                                                           "input_logprobs", "top_ids", "top_logprobs"))

log = logging.getLogger("tokenrouter.remote_branch")

HEAVY_URL_ENV = "TOKENROUTER_HEAVY_URL"  # overrides the router's heavy_url parameter
DEFAULT_TIMEOUT_S = 60.0  # deadline of one step (a long prefill on a busy heavy server)
DEFAULT_CONNECT_RETRIES = 3  # retries after the first attempt when the server is unreachable
DEFAULT_BACKOFF_S = 0.25  # first retry delay; doubles each retry
MAX_BACKOFF_S = 2.0  # cap of one retry delay
RECONNECT_BACKOFF_MS = 100  # gRPC's own reconnect delay after a refused connect (default 1 s)

_UNREACHABLE = ("StatusCode.UNAVAILABLE",)
_TIMED_OUT = ("StatusCode.DEADLINE_EXCEEDED",)
# Triton datatype of each input: the config.pbtxt type without its TYPE_ prefix (STRING is BYTES).
_INPUT_DTYPES = {name: dtype.removeprefix("TYPE_").replace("STRING", "BYTES") for name, dtype in TENSOR_INPUTS.values()}


def resolve_heavy_url(param: str | None) -> str:
    """The heavy server URL(s) to use: $TOKENROUTER_HEAVY_URL if set, else ``param``; "" = BLS.

    Several servers are a comma-separated list (``heavy_pool.parse_heavy_urls``)."""
    return (os.environ.get(HEAVY_URL_ENV) or param or "").strip()


class ServerUnreachable(BranchUnreachable):
    """The remote server could not be reached (refused, reset, gone) after every retry."""


class RemoteBranch(Branch):
    """A branch model on another Triton server, reached with ``tritonclient.grpc.aio``."""

    def __init__(
        self,
        name: str,
        url: str,
        model: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_retries: int = DEFAULT_CONNECT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        parameters: dict[str, str] | None = None,
    ):
        if not url:
            raise ValueError(f"RemoteBranch {name}: url is empty (host:port of the gRPC endpoint)")
        if timeout_s <= 0 or connect_retries < 0 or backoff_s < 0:
            raise ValueError(
                f"RemoteBranch {name}: need timeout_s > 0, connect_retries >= 0, backoff_s >= 0; "
                f"got {timeout_s}, {connect_retries}, {backoff_s}")
        self.name = name
        self.url = url
        self.model = model or name
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.backoff_s = backoff_s
        self.parameters = dict(parameters) if parameters else None  # request parameters: the branch key
        self._current: _Channel | None = None  # the channel new calls use
        self._closed = False

    def __repr__(self) -> str:
        return f"RemoteBranch({self.name!r}, url={self.url!r}, model={self.model!r})"

    @property
    def where(self) -> str:
        return f"{self.name} branch (model '{self.model}' at grpc://{self.url})"

    async def step(self, op: BranchOp) -> BranchResult:
        if self._closed:
            raise BranchError(f"{self.where}: closed")
        inputs, outputs = self._request(op)
        delay = self.backoff_s
        for attempt in range(self.connect_retries + 1):
            async with self._channel() as channel:
                try:
                    response = await channel.client.infer(
                        self.model, inputs, outputs=outputs, client_timeout=self.timeout_s,
                        parameters=self.parameters)
                    return self._result(response)
                except BranchError:
                    raise
                except Exception as exc:  # noqa: BLE001 - classified below, never swallowed
                    if not _is_unreachable(exc):
                        raise self._error(exc) from exc
                    log.warning("%s unreachable (attempt %d of %d): %s",
                                self.where, attempt + 1, self.connect_retries + 1, _message(exc))
                    self._retire(channel)  # the next attempt opens a fresh channel, which reconnects at once
                    if attempt == self.connect_retries:
                        raise ServerUnreachable(
                            f"{self.where} is unreachable after {attempt + 1} attempts: "
                            f"{_message(exc)}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
        raise AssertionError("unreachable")  # the loop always returns or raises

    async def ready(self, timeout_s: float) -> bool:
        """Whether the server answers and its model is ready (health API); never raises."""
        if self._closed:
            return False
        async with self._channel() as channel:
            try:
                return bool(await channel.client.is_model_ready(self.model, client_timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                log.debug("%s not ready: %s", self.where, _message(exc))
                self._retire(channel)
                return False

    async def close(self) -> None:
        """Close the gRPC channel (once its calls in flight end); later steps fail. Idempotent."""
        self._closed = True
        channel = self._current
        if channel is not None:
            self._retire(channel)
            if channel.calls == 0:
                await channel.close()

    # ---- helpers -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _channel(self):
        """The current channel, counted as in use while the block runs.

        Concurrent steps share one channel. A channel is retired when a call finds the
        server unreachable, and closed only when its last call ends: closing it under
        other calls would cancel them (``asyncio.CancelledError``, not a gRPC error), and
        their requests would never get an answer.
        """
        if self._current is None:
            self._current = _Channel(self.url)
        channel = self._current
        channel.calls += 1
        try:
            yield channel
        finally:
            channel.calls -= 1
            if channel.retired and channel.calls == 0:
                await channel.close()

    def _retire(self, channel: "_Channel") -> None:
        if self._current is channel:
            self._current = None
        channel.retired = True

    @staticmethod
    def _request(op: BranchOp):
        import tritonclient.grpc.aio as grpcclient

        inputs = []
        for name, array in op_to_arrays(op).items():
            tensor = grpcclient.InferInput(name, list(array.shape), _INPUT_DTYPES[name])
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        # no requested outputs: the server returns every output its model has, so a heavy server
        # whose config predates an optional output (reused_tokens, ...) still answers
        return inputs, None

    def _result(self, response) -> BranchResult:
        def get(name):
            array = response.as_numpy(name)
            if array is None and name not in OPTIONAL_OUTPUTS:
                raise BranchError(f"{self.where}: response lacks output '{name}'")
            return array

        return result_from_arrays(get)

    def _error(self, exc: Exception) -> BranchError:
        msg = _message(exc)
        if is_session_missing(msg):
            return SessionMissing(f"{self.where}: {msg}")
        if any(code in _status(exc) for code in _TIMED_OUT):
            return BranchTimeout(f"{self.where}: no answer within {self.timeout_s:g} s ({msg})")
        return BranchError(f"{self.where}: {msg}")


class _Channel:
    """One ``tritonclient.grpc.aio`` client and how many calls are using it."""

    def __init__(self, url: str):
        import tritonclient.grpc.aio as grpcclient

        self.url = url
        self.client = grpcclient.InferenceServerClient(url, channel_args=_channel_args())
        self.calls = 0
        self.retired = False

    async def close(self) -> None:
        try:
            await self.client.close()
        except Exception as exc:  # noqa: BLE001 - a broken channel is being discarded
            log.debug("closing channel to %s: %s", self.url, exc)


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's defaults plus a private subchannel pool and short reconnect backoff.

    gRPC shares subchannels between channels by default, so a "fresh" channel would inherit
    the old one's reconnect backoff (up to minutes) after the remote was down.
    """
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", 10 * RECONNECT_BACKOFF_MS),
    ]


def _status(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return str(status() if callable(status) else status or "")


def _message(exc: Exception) -> str:
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return text or type(exc).__name__


def _is_unreachable(exc: Exception) -> bool:
    return any(code in _status(exc) for code in _UNREACHABLE)
