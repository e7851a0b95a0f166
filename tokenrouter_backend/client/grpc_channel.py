"""gRPC channel options for a long-lived client of a Triton server that may restart.

tritonclient's own defaults plus a short reconnect backoff and a private subchannel pool:
with gRPC's defaults a channel whose server was down for minutes (a restart reloading the
models) waits up to 120 s between reconnect attempts, so it keeps failing long after the
server is back. The router's `RemoteBranch` sets the same options (branches/remote.py).
"""
from __future__ import annotations

RECONNECT_BACKOFF_MS = 100   # first reconnect delay after a refused connect (gRPC's default: 1 s)
MAX_RECONNECT_BACKOFF_MS = 1000  # the longest wait between attempts (gRPC's default: 120 s)


def reconnecting_channel_args() -> list[tuple[str, int]]:
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
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
