#!/usr/bin/env python
"""Which of tritonserver's paths keep a Python-backend error code (``TritonError(msg, code)``).

    .venv/bin/python research/studies/triton_error_codes.py

Writes two probe models into a temporary repository (one plain, one decoupled; each answers
every request with an error carrying the code its input names), starts tritonserver on free
loopback ports, and prints, per code, the HTTP status of ``/infer`` and ``/generate`` (and
``/generate_stream`` of the decoupled one), the gRPC status of a unary call and what a
decoupled model's gRPC stream reports. docs/security.md ("Errors") quotes the result for the
wheel's tritonserver 2.51. Run from the repository root.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import requests

CODES = ["INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL", "UNSUPPORTED", "NOT_FOUND", "ALREADY_EXISTS",
         "UNKNOWN"]
MODEL = '''import json
import triton_python_backend_utils as pb


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        out = []
        for r in requests:
            name = pb.get_input_tensor_by_name(r, "code").as_numpy().reshape(-1)[0].decode()
            resp = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"probe {name}",
                                                                                 getattr(pb.TritonError, name)))
            if self.decoupled:
                r.get_response_sender().send(resp, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                out.append(resp)
        return None if self.decoupled else out
'''
CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "code" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "out" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}'''


def write_repository(root: Path) -> None:
    for name, extra in (("probe", ""), ("probe_dec", "model_transaction_policy { decoupled: true }\n")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def probe(server, code: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    http = server.http_url
    row = [code]
    body = {"inputs": [{"name": "code", "shape": [1], "datatype": "BYTES", "data": [code]}]}
    row.append(f"/infer {requests.post(f'{http}/v2/models/probe/infer', json=body, timeout=30).status_code}")
    generate = requests.post(f"{http}/v2/models/probe/generate", json={"code": code}, timeout=30)
    row.append(f"/generate {generate.status_code}")
    for path in ("generate", "generate_stream"):
        r = requests.post(f"{http}/v2/models/probe_dec/{path}", json={"code": code}, timeout=30)
        row.append(f"decoupled /{path} {r.status_code}")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("code", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([code.encode()], dtype=np.object_))
    try:
        client.infer("probe", [tensor])
    except Exception as exc:  # noqa: BLE001 - the error is the point
        row.append(f"gRPC unary {exc.status()}")
    errors = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    client.async_stream_infer("probe_dec", [tensor])
    time.sleep(1.0)
    client.stop_stream()
    row.append(f"decoupled gRPC stream status={errors[0].status() if errors and errors[0] else None}")
    return row


def main() -> None:
    from tokenrouter_backend.server.process import TritonServer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repository"
        write_repository(root)
        with TritonServer(root, log_path=Path(tmp) / "triton.log", ready_timeout_s=180) as server:
            for code in CODES:
                print(" | ".join(probe(server, code)), flush=True)


if __name__ == "__main__":
    main()
