"""Call a branch model (heavy / light) directly over HTTP or gRPC, with or without a key."""
from __future__ import annotations

import numpy as np

from tokenrouter_backend.core.protocol.branch_auth import key_parameters
from tokenrouter_backend.core.protocol.branch_protocol import TENSOR_INPUTS, BranchOp, op_to_arrays

DTYPES = {name: dtype.removeprefix("TYPE_").replace("STRING", "BYTES") for name, dtype in TENSOR_INPUTS.values()}


def _inputs(module, op: BranchOp):
    inputs = []
    for name, array in op_to_arrays(op).items():
        tensor = module.InferInput(name, list(array.shape), DTYPES[name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def branch_call(transport: str, url: str, model: str, op: BranchOp, key: str | None = None):
    """One step; returns (tokens or None, error text or None). ``url``: http(s) URL or host:port."""
    if transport == "http":
        import tritonclient.http as module
        client = module.InferenceServerClient(url.removeprefix("http://"))
    else:
        import tritonclient.grpc as module
        client = module.InferenceServerClient(url)
    try:
        params = key_parameters(key) if key is not None else None
        result = client.infer(model, _inputs(module, op), parameters=params)
        return np.asarray(result.as_numpy("tokens")).reshape(-1).tolist(), None
    except Exception as exc:  # noqa: BLE001 - tritonclient raises InferenceServerException
        return None, str(exc)
    finally:
        client.close()
