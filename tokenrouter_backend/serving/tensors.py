"""Tensor helpers shared by the Triton glue: config parameters and optional scalar inputs.

The only place that unwraps ``[0][0]`` from Triton tensors; pb_utils is passed in.
``bound_bytes_inputs`` installs the bounded BYTES deserializer
(``core/protocol/input_limits.bounded_bytes_deserializer``) in a model's stub.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from tokenrouter_backend.core.protocol.input_limits import bounded_bytes_deserializer
from tokenrouter_backend.core.protocol.params import InvalidRequest


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


def bound_bytes_inputs(pb_utils) -> None:
    """Make this stub deserialize BYTES inputs through the bounded deserializer.

    The Python backend's stub turns every BYTES input into a numpy object array element by
    element (``triton_python_backend_utils.deserialize_bytes_tensor``, looked up at each
    request) before ``execute`` sees the request, so a count check in the model alone comes
    after the per-element work: 10^6 ``stop_words`` cost seconds. The bounded one stops
    after ``MAX_BYTES_ELEMENTS`` and never copies an element over ``MAX_BYTES_ELEMENT`` bytes.
    """
    if hasattr(pb_utils, "deserialize_bytes_tensor"):
        pb_utils.deserialize_bytes_tensor = bounded_bytes_deserializer()


def check_scalar(array: np.ndarray | None, name: str) -> None:
    """An optional scalar input holds at most one value (else refused by name)."""
    if array is not None and array.size > 1:
        raise InvalidRequest(f"{name} must hold one value; got {array.size}")


def input_scalar(pb_utils, request, name: str) -> Any:
    """An optional scalar input as a python value (bytes decoded), None when absent."""
    arr = input_array(pb_utils, request, name)
    if arr is None or arr.size == 0:
        return None
    value = arr.flat[0]
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
