"""The Python backend's utilities as plain callables for the layers below ``serving/``.

``branches/`` and ``operations/`` never see ``pb_utils``: the router model builds these
from it and passes them in. ``bls_exec`` is the BLS call a ``BlsBranch`` makes (arrays in,
an answer of arrays out); ``metric_family`` makes the Prometheus families of
``operations/metrics.py`` and of the branch models.

A BLS call blocks one thread until its model answers (``InferenceRequest.exec``;
``async_exec`` runs it on the event loop's shared default executor). Each model gets its own
threads here instead, so calls a stopped or stuck branch holds past their deadline
(``branches/deadline.py``) never take the threads the other branch's calls need.
"""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

import numpy as np

from tokenrouter_backend.branches.bls import BlsAnswer, ExecBls
from tokenrouter_backend.operations.metrics import COUNTER, GAUGE, HISTOGRAM

# threads per called model: what the shared default executor has (ThreadPoolExecutor's default)
BLS_THREADS = min(32, (os.cpu_count() or 1) + 4)


def bls_exec(pb_utils, threads: int = BLS_THREADS) -> ExecBls:
    """``exec_bls(model_name, inputs, parameters, timeout_ms)``: one ``InferenceRequest.exec()`` on
    the called model's own threads."""
    pools: dict[str, ThreadPoolExecutor] = {}

    async def exec_bls(model_name: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, str],
                       timeout_ms: int) -> BlsAnswer:
        kwargs: dict[str, Any] = {"timeout": timeout_ms * 1000} if timeout_ms else {}  # microseconds; 0 = none
        if parameters:
            kwargs["parameters"] = dict(parameters)
        # no requested outputs: Triton returns every output the branch's config declares, so a
        # branch of a repository exported before an optional output existed still answers
        # (requesting an undeclared output fails the request); result_from_arrays defaults it
        request = pb_utils.InferenceRequest(
            model_name=model_name, inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            requested_output_names=[], **kwargs)
        pool = pools.get(model_name)
        if pool is None:
            pool = pools[model_name] = ThreadPoolExecutor(threads, thread_name_prefix=f"bls-{model_name}")
        response = await asyncio.get_running_loop().run_in_executor(pool, request.exec)
        if response.has_error():
            return BlsAnswer(error=response.error().message())

        def output(name: str) -> np.ndarray | None:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            return None if tensor is None else tensor.as_numpy()

        return BlsAnswer(output=output)

    return exec_bls


def metric_family(pb_utils) -> Callable[[str, str, str], Any]:
    """``new_family(name, description, kind)`` (kind ``counter`` | ``gauge`` | ``histogram``) -> a
    ``MetricFamily``, or None for a kind this backend lacks (HISTOGRAM before the 24.10 stubs)."""

    def new_family(name: str, description: str, kind: str):
        family = pb_utils.MetricFamily
        triton_kind = {COUNTER: family.COUNTER, GAUGE: family.GAUGE,
                       HISTOGRAM: getattr(family, "HISTOGRAM", None)}[kind]
        return None if triton_kind is None else family(name, description, triton_kind)

    return new_family
