"""The door's gRPC side: a pass-through proxy (grpc.aio generic handler) in front of tritonserver's gRPC port.

Every method — unary and streaming alike, ``ModelStreamInfer``'s bidirectional stream among
them — is relayed as a stream of raw message bytes (no protobuf decoding or re-encoding):
the client's metadata (the admin key among it) and deadline go upstream; tritonserver's
initial metadata, messages, status code, details and trailing metadata come back; a client
that cancels cancels the upstream call. The door's server refuses any message larger than
the limit (``grpc.max_receive_message_length``) with ``RESOURCE_EXHAUSTED`` before it
reaches tritonserver. tritonserver not answering (a restart) is ``UNAVAILABLE``.
"""
from __future__ import annotations

from typing import AsyncIterator

import grpc

# metadata gRPC itself sets on every call; forwarding it would be refused or duplicated
RESERVED_METADATA_PREFIXES = (":", "grpc-")
RESERVED_METADATA = frozenset({"user-agent", "content-type", "te", "host"})


def forwarded_metadata(metadata) -> tuple[tuple[str, str | bytes], ...]:
    """The client's own metadata, without what gRPC sets itself."""
    return tuple((k, v) for k, v in (metadata or ())
                 if k not in RESERVED_METADATA and not k.startswith(RESERVED_METADATA_PREFIXES))


class Relay(grpc.GenericRpcHandler):
    """Every method relayed to ``channel`` as bytes."""

    def __init__(self, channel: grpc.aio.Channel):
        self.channel = channel

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        upstream_method = self.channel.stream_stream(method)  # no (de)serializers: bytes in, bytes out

        async def relay(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
            call = upstream_method(requests, metadata=forwarded_metadata(context.invocation_metadata()),
                                   timeout=context.time_remaining())
            try:
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(forwarded_metadata(initial))
                async for reply in call:
                    yield reply
                trailing = await call.trailing_metadata()
                if trailing:
                    context.set_trailing_metadata(forwarded_metadata(trailing))
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "",
                                    forwarded_metadata(err.trailing_metadata()))
            finally:
                call.cancel()  # a no-op once the call ended; cancels it when the client went away

        return grpc.stream_stream_rpc_method_handler(relay)


def server_options(limit: int) -> list[tuple[str, int]]:
    """The door server's options: messages from clients at most ``limit`` bytes."""
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)]


# tritonserver's answers are not limited here (they are the models' outputs)
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_server(upstream: str, host: str, port: int, limit: int) -> tuple[grpc.aio.Server,
                                                                               grpc.aio.Channel, int]:
    """The started door server on ``host:port`` relaying to ``upstream`` (host:port); its channel
    and the port it listens on."""
    channel = grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS)
    server = grpc.aio.server(options=server_options(limit))
    server.add_generic_rpc_handlers((Relay(channel),))
    bound = server.add_insecure_port(host_port(host, port))
    if not bound:
        await channel.close()
        raise OSError(f"the door cannot listen for gRPC on {host_port(host, port)}")
    await server.start()
    return server, channel, bound
