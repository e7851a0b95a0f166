"""Shared test helpers: fakes, fixtures, a fake gRPC server, repository builders."""
