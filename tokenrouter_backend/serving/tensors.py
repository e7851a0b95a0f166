"""Tensor helpers shared by the Triton glue: config parameters and optional scalar inputs.

The only place that unwraps ``[0][0]`` from Triton tensors; pb_utils is passed in.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np


def config_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt ``parameters`` as a plain {name: string} dict."""
    config = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def config_outputs(args: dict) -> frozenset[str]:
    """Names of the outputs config.pbtxt declares (Triton refuses a response with any other)."""
    return frozenset(o["name"] for o in json.loads(args["model_config"]).get("output", []))


def input_array(pb_utils, request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def input_scalar(pb_utils, request, name: str) -> Any:
    """An optional scalar input as a python value (bytes decoded), None when absent."""
    arr = input_array(pb_utils, request, name)
    if arr is None or arr.size == 0:
        return None
    value = arr.reshape(-1)[0]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def error_response(pb_utils, message: str, code: str = "INVALID_ARG"):
    """An error response; ``code`` names a ``TritonError`` code (tritonserver 2.51's Python
    backend has them all; it turns them into the HTTP / unary gRPC status)."""
    value = getattr(pb_utils.TritonError, code, None)
    error = pb_utils.TritonError(message, value) if value is not None else pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
