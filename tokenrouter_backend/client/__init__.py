"""TokenRouter clients of a running server: HTTP / gRPC generation, the gRPC channel options,
the demo's requests, the routing view of `generate --show-routing`."""
