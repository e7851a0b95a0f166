"""``Branch`` over Triton BLS: the router calls the heavy/light models inside the server.

The BLS call comes in as a plain coroutine function (``ExecBls``: model name, input arrays,
request parameters, timeout -> ``BlsAnswer``), built from the Python backend's utilities by
``serving/backend.py``, so this module imports and runs without Triton.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

import numpy as np

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchOp,
    BranchResult,
    decode_error,
    op_to_arrays,
    result_from_arrays,
)


def _no_output(name: str) -> None:
    return None


@dataclass(frozen=True)
class BlsAnswer:
    """One BLS response as plain Python: its error message, or its output arrays by name."""

    error: str | None = None  # the response's error message; None: it answered
    output: Callable[[str], np.ndarray | None] = _no_output  # an output's array; None when absent


# (model name, input arrays by name, request parameters, timeout in ms; 0 = none) -> the answer
ExecBls = Callable[[str, Mapping[str, np.ndarray], Mapping[str, str], int], Awaitable[BlsAnswer]]


class BlsBranch(Branch):
    """One branch model reached with a BLS call (``InferenceRequest.exec()`` on the model's own threads)."""

    def __init__(self, name: str, model_name: str, exec_bls: ExecBls, timeout_ms: int = 0,
                 parameters: dict[str, str] | None = None):
        self.name = name
        self.parameters = dict(parameters or {})  # request parameters: the branch key
        self.model_name = model_name
        self.exec_bls = exec_bls
        self.timeout_ms = timeout_ms  # 0 = no BLS timeout

    @property
    def where(self) -> str:
        return f"{self.name} branch ({self.model_name})"

    async def step(self, op: BranchOp) -> BranchResult:
        answer = await self.exec_bls(self.model_name, op_to_arrays(op), self.parameters, self.timeout_ms)
        if answer.error is not None:
            raise decode_error(f"{self.where}: {answer.error}")
        return result_from_arrays(answer.output)
