"""The Branch implementations the block loop talks to: in-process, Triton BLS, remote gRPC; the
local pair.
"""
