"""A fake Triton gRPC endpoint for RemoteBranch tests: speaks KServe v2 ModelInfer, ModelReady.

ModelReady answers ``ready`` (counted in ``ready_checks``). ModelInfer decodes the branch
tensors into a ``BranchOp`` (``branch_protocol.op_from_arrays``), asks a scripted
``handler(op) -> BranchResult`` (``scripted``: next token = input + 1; or raises to send an
error), and encodes the result with ``result_to_arrays``. Runs in grpc's own threads, so
tests may start, stop and restart it (same port) around ``asyncio.run`` calls.
"""
from __future__ import annotations

import time
from concurrent import futures

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult, op_from_arrays, result_to_arrays

NP_OF = {"UINT64": np.uint64, "INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_}
TRITON_OF = {np.dtype(v).str: k for k, v in NP_OF.items()}


def scripted(op: BranchOp) -> BranchResult:
    """Echo-ish: next token = input + 1; a dist when asked."""
    n = len(op.input_ids)
    dist = np.full((n, 4), 0.25, dtype=np.float32) if op.return_dist else None
    return BranchResult(
        tokens=np.asarray(op.input_ids, dtype=np.int32) + 1,
        token_probs=np.linspace(0.5, 0.9, n, dtype=np.float32),
        entropy=np.full(n, 0.125, dtype=np.float32),
        input_probs=np.full(n - 1, 0.75, dtype=np.float32),
        session_len=op.keep_len + n,
        dist=dist,
        forward_ms=1.5,
        batch_size=3,
    )


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, fake: "FakeBranchServer"):
        self.fake = fake

    def ModelInfer(self, request, context):  # noqa: N802 - gRPC method name
        arrays = {
            t.name: np.frombuffer(raw, dtype=NP_OF[t.datatype]).reshape(tuple(t.shape))
            for t, raw in zip(request.inputs, request.raw_input_contents)
        }
        op = op_from_arrays(arrays.get)
        self.fake.ops.append((request.model_name, op))
        if self.fake.delay_s:
            time.sleep(self.fake.delay_s)
        try:
            result = self.fake.handler(op)
        except Exception as exc:  # noqa: BLE001 - sent back like Triton sends model errors
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        for name, array in result_to_arrays(result).items():
            array = np.ascontiguousarray(array)
            out = response.outputs.add()
            out.name = name
            out.datatype = TRITON_OF[array.dtype.str]
            out.shape.extend(array.shape)
            response.raw_output_contents.append(array.tobytes())
        return response

    def ModelReady(self, request, context):  # noqa: N802 - gRPC method name
        self.fake.ready_checks += 1
        return service_pb2.ModelReadyResponse(ready=self.fake.ready)


class FakeBranchServer:
    """``with FakeBranchServer(handler) as fake: fake.url`` ; ``stop()``/``start()`` to flap."""

    def __init__(self, handler, port: int = 0):
        self.handler = handler
        self.port = port
        self.delay_s = 0.0
        self.ready = True  # what ModelReady answers
        self.ready_checks = 0
        self.ops: list = []
        self._server = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "FakeBranchServer":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if port == 0:
            raise RuntimeError(f"fake Triton: cannot bind 127.0.0.1:{self.port}")
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> "FakeBranchServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
