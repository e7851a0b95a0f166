"""RemoteBranch against a real tritonserver (the launcher's) serving a scripted branch model.

The model speaks the branch tensor contract through ``branch_protocol`` inside the server, so
this checks names, datatypes and shapes end to end; it also stops the server (clear
BranchError, fast) and restarts it on the same ports (the next call works).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from support.triton_repo import write_python_model  # pytest puts tests/ on sys.path
from tokenrouter_backend.branches.remote import RemoteBranch
from tokenrouter_backend.core.protocol.branch_protocol import (
    SENT_WHEN_SET,
    TENSOR_INPUTS,
    BranchError,
    BranchOp,
    SessionMissing,
)
from tokenrouter_backend.server.ports import free_ports

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

MISSING_KEEP_LEN = 999  # the scripted model answers SessionMissing for this keep_len
OUTPUTS_CONFIG = """\
  {{ name: "tokens" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "token_probs" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "entropy" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "input_probs" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "session_len" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "dist" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "forward_ms" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "batch_size" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "forward_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "forwards" data_type: TYPE_INT32 dims: [ 1 ] }}
"""

SCRIPTED_BRANCH_MODEL = f"""\
import numpy as np
import triton_python_backend_utils as pb_utils
from tokenrouter_backend.core.protocol.branch_protocol import (
    BranchResult, SessionMissing, op_from_arrays, result_to_arrays)


def scripted(op):
    if op.keep_len == {MISSING_KEEP_LEN}:
        raise SessionMissing(f"session {{op.session_id}} expired")
    n = len(op.input_ids)
    return BranchResult(
        tokens=np.asarray(op.input_ids, dtype=np.int32) + 1,
        token_probs=np.full(n, 0.5, dtype=np.float32),
        entropy=np.full(n, 0.25, dtype=np.float32),
        input_probs=np.full(n - 1, 0.75, dtype=np.float32),
        session_len=op.keep_len + n,
        dist=np.full((n, 3), 1 / 3, dtype=np.float32) if op.return_dist else None,
        forward_ms=2.0 + len(op.cache_salt.encode()), batch_size=1)  # the salt's bytes: it crossed


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def get(name):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()
            try:
                arrays = result_to_arrays(scripted(op_from_arrays(get)))
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()]))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{{type(exc).__name__}}: {{exc}}")))
        return responses
"""


def branch_config() -> str:
    """config.pbtxt template (``{name}`` placeholder) built from the contract's input table."""
    inputs = ",\n".join(
        f'  {{{{ name: "{name}" data_type: {dtype} dims: [ {"-1" if key == "input_ids" else "1"} ]'
        f'{" optional: true" if key in SENT_WHEN_SET else ""} }}}}'  # sent only when set
        for key, (name, dtype) in TENSOR_INPUTS.items())
    return ('name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            f"input [\n{inputs}\n]\noutput [\n{OUTPUTS_CONFIG}]\n"
            "instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote_repo")
    write_python_model(root, "heavy", SCRIPTED_BRANCH_MODEL, config=branch_config())
    return root


OP = BranchOp(session_id=7, keep_len=4, input_ids=(20, 21, 22), draft_len=2, return_dist=True)


async def step(branch: RemoteBranch, op: BranchOp = OP):
    return await branch.step(op)


def test_step_through_a_real_server(start_triton, repo):
    server = start_triton(repo)
    branch = RemoteBranch("heavy", server.grpc_url, timeout_s=10, connect_retries=1, backoff_s=0.1)

    async def scenario():
        res = await step(branch)
        with pytest.raises(SessionMissing, match="session 7 expired"):
            await step(branch, BranchOp(session_id=7, keep_len=MISSING_KEEP_LEN, input_ids=(1,)))
        salted = await step(branch, BranchOp(session_id=8, keep_len=0, input_ids=(1, 2), cache_salt="tenant-é"))
        assert salted.forward_ms == 2.0 + len("tenant-é".encode())  # a BYTES input, as sent
        await branch.release(7)
        await branch.close()
        return res

    res = asyncio.run(scenario())
    assert res.tokens.tolist() == [21, 22, 23]
    assert res.input_probs.tolist() == [0.75, 0.75]
    assert res.session_len == 7 and res.forward_ms == 2.0
    assert res.dist is not None and res.dist.shape == (3, 3)
    assert res.margin.size == 0  # this config predates the margin output (and reused_tokens): unknown, no error


def test_server_down_then_back(start_triton, repo):
    http, grpc, metrics = free_ports(3)  # fixed: a restart must come back on the same port
    server = start_triton(repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
    branch = RemoteBranch("heavy", server.grpc_url, timeout_s=10, connect_retries=2, backoff_s=0.1)

    async def scenario():
        before = await step(branch)
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(BranchError) as err:
            await step(branch)
        down_s = time.monotonic() - t0
        server.start()
        server.wait_ready()
        assert server.grpc_url == branch.url
        after = await step(branch)
        await branch.close()
        return before, err.value, down_s, after

    before, error, down_s, after = asyncio.run(scenario())
    assert server.grpc_url in str(error) and "'heavy'" in str(error)
    assert down_s < 3.0, f"a stopped server took {down_s:.1f} s to fail"
    assert before.tokens.tolist() == after.tokens.tolist() == [21, 22, 23]
