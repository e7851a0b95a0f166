"""Glue for operations: the request fields admission needs, read from Triton tensors."""
from __future__ import annotations

from tokenrouter_backend.operations.admission import RequestInfo
from tokenrouter_backend.serving.request import OPTIONAL_INPUTS, PROMPT_INPUT
from tokenrouter_backend.serving.tensors import input_array, input_scalar

DECISION_LOG_INPUT = "decision_log"  # optional BOOL: log this request's blocks
DYNAMIC_QUANTILE_INPUT = "dynamic_threshold_quantile"  # optional FP32: per-request dynamic threshold


def request_info(pb_utils, request) -> RequestInfo:
    prompt = input_array(pb_utils, request, PROMPT_INPUT)
    log = input_scalar(pb_utils, request, DECISION_LOG_INPUT)
    quantile = input_scalar(pb_utils, request, DYNAMIC_QUANTILE_INPUT)
    request_id = request.request_id() if hasattr(request, "request_id") else ""
    return RequestInfo(
        request_id=str(request_id or ""),
        prompt=tuple(int(t) for t in prompt.reshape(-1)) if prompt is not None else (),
        explicit_mode=input_scalar(pb_utils, request, OPTIONAL_INPUTS["router_mode"]) not in (None, ""),
        decision_log=None if log is None else bool(log),
        dynamic_quantile=None if quantile is None else float(quantile),
    )
