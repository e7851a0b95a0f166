"""``Branch`` over Triton BLS: the router calls the heavy/light models inside the server.

``pb_utils`` is passed in (not imported) so this module imports without Triton.
"""
from __future__ import annotations

from tokenrouter_backend.core.branch import Branch
from tokenrouter_backend.core.branch_protocol import (
    BranchOp,
    BranchResult,
    decode_error,
    op_to_arrays,
    result_from_arrays,
)


class BlsBranch(Branch):
    """One branch model reached with ``InferenceRequest.async_exec()``."""

    def __init__(self, name: str, model_name: str, pb_utils, timeout_ms: int = 0,
                 parameters: dict[str, str] | None = None):
        self.name = name
        self.parameters = dict(parameters or {})  # request parameters: the branch key
        self.model_name = model_name
        self.pb_utils = pb_utils
        self.timeout_ms = timeout_ms  # 0 = no BLS timeout
        # no requested outputs: Triton returns every output the branch's config declares, so a
        # branch of a repository exported before an optional output existed still answers
        # (requesting an undeclared output fails the request); result_from_arrays defaults it
        self._outputs: list[str] = []

    async def step(self, op: BranchOp) -> BranchResult:
        pb = self.pb_utils
        inputs = [pb.Tensor(name, value) for name, value in op_to_arrays(op).items()]
        kwargs = {"timeout": self.timeout_ms * 1000} if self.timeout_ms else {}
        if self.parameters:
            kwargs["parameters"] = self.parameters
        request = pb.InferenceRequest(
            model_name=self.model_name, inputs=inputs, requested_output_names=self._outputs, **kwargs
        )
        response = await request.async_exec()
        if response.has_error():
            raise decode_error(f"{self.name} branch ({self.model_name}): {response.error().message()}")

        def get(name):
            tensor = pb.get_output_tensor_by_name(response, name)
            return None if tensor is None else tensor.as_numpy()

        return result_from_arrays(get)
