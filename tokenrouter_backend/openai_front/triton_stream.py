"""One generation as the ensemble's three steps, as an async iterator of ``Piece``s.

The prompt is text, or token ids: those go to ``preprocessing`` as its ``input_ids`` (not
tokenized; checked against the vocabulary there), so the router gets them with the same
``STOP_IDS`` and ``END_ID`` as a text prompt and bounds their length as any prompt's.

The front runs the ensemble's steps itself over gRPC — ``preprocessing`` (text → ids), the
decoupled ``router`` on its own stream, ``postprocessing`` (ids → text) per response —
because tritonserver 2.51 does not pass a cancelled ensemble stream on to the router step
(measured: the router keeps generating and its KV sessions stay live), while a cancelled
stream to the router itself is seen at once. The answer is the ensemble's, tensor for
tensor (docs/architecture.md has the step contract). Leaving the iteration early (the HTTP
client went away, the task was cancelled) cancels the router's stream: it releases its KV
sessions. The request side stays open until the final response, so Triton never sees a
half-closed stream mid-generation.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence, Union

import numpy as np

from tokenrouter_backend.client.triton_client import grpc_inputs, top_lists
from tokenrouter_backend.core.protocol.failures import classify

from .errors import OpenAIError, from_server, unavailable
from .logprobs import TokenScores

LOG = logging.getLogger("tokenrouter.openai_front")
FINAL_FLAG = "triton_final_response"
PREPROCESSING, ROUTER, POSTPROCESSING = "preprocessing", "router", "postprocessing"
PRE_OUTPUTS = ("INPUT_ID", "STOP_IDS", "END_ID")
ROUTER_TO_POST = {"OUTPUT_IDS": "TOKENS", "PREFIX_LEN": "PREFIX_LEN", "IS_FINAL": "IS_FINAL",
                  "ROUTING_STATS": "ROUTING_STATS_IN", "STOP_TRIM": "STOP_TRIM"}
PRE_ONLY_INPUTS = ("text_input", "end_id", "exclude_input_in_output")  # the ensemble maps these to preprocessing


@dataclass
class Piece:
    """New text of one response and the routing stats so far (cumulative); with
    ``return_log_probs``, its new tokens' log-probabilities."""

    text: str
    stats: dict = field(default_factory=dict)
    logprobs: list[TokenScores] = field(default_factory=list)
    prompt_logprobs: list[TokenScores] = field(default_factory=list)  # return_prompt_log_probs: first response


def _prompt_scores(result, prompt_ids: np.ndarray) -> list[TokenScores]:
    """The prompt's tokens with the heavy model's numbers (the first token has none)."""
    lps = result.as_numpy("prompt_log_probs")
    if lps is None or lps.size == 0:
        return []
    lps = lps.reshape(-1)
    tops = top_lists(len(lps), result.as_numpy("prompt_top_ids"), result.as_numpy("prompt_top_log_probs"))
    ids = prompt_ids.tolist()
    return [TokenScores(int(ids[0]), None, "", ())] + [
        TokenScores(int(t), float(lp), "heavy", tuple(top)) for t, lp, top in zip(ids[1:], lps.tolist(), tops)]


def _token_scores(result) -> list[TokenScores]:
    """The router response's new tokens (past ``PREFIX_LEN``) with their log-prob outputs."""
    lps = result.as_numpy("output_log_probs")
    if lps is None or lps.size == 0:
        return []
    ids = result.as_numpy("OUTPUT_IDS").reshape(-1)[int(result.as_numpy("PREFIX_LEN").reshape(-1)[0]):]
    lps = lps.reshape(-1)
    branches = result.as_numpy("output_log_prob_branches").reshape(-1)
    tops = top_lists(len(lps), result.as_numpy("output_top_ids"), result.as_numpy("output_top_log_probs"))
    return [TokenScores(int(t), float(lp), b.decode() if isinstance(b, bytes) else str(b), tuple(top))
            for t, lp, b, top in zip(ids.tolist(), lps.tolist(), branches, tops)]


def _tensor(grpcclient, name: str, array: np.ndarray):
    kind = "BYTES" if array.dtype == np.object_ else {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}[array.dtype]
    t = grpcclient.InferInput(name, list(array.shape), kind)
    t.set_data_from_numpy(array)
    return t


async def _call(coro, what: str):
    """Await one Triton call; its failure as the OpenAIError a client should see."""
    from tritonclient.utils import InferenceServerException

    try:
        return await coro
    except InferenceServerException as exc:
        status, message = str(exc.status()), exc.message() or ""
        if "UNAVAILABLE" in status and classify(message) is None:  # the connection, not a model's answer
            LOG.warning("the inference server is not reachable (%s): %s", what, message)
            raise unavailable(f"the inference server is not reachable ({what})") from exc
        raise from_server(message, status) from exc


async def generate(client, prompt: Union[str, Sequence[int]], stream: bool, knobs: dict[str, Any],
                   request_id: str, timeout_s: float, content_spans: list[int] | None = None) -> AsyncIterator[Piece]:
    """Yield the answer's pieces; raise ``OpenAIError`` for an error the server answered with.

    ``prompt``: its text, or its token ids. ``content_spans``: where a chat prompt's message
    contents are (``preprocessing`` keeps special-token text there as text)."""
    import grpc
    import tritonclient.grpc.aio as grpcclient

    text = isinstance(prompt, str)
    inputs = grpc_inputs(grpcclient, prompt if text else "", stream, knobs)
    pre_inputs = [t for t in inputs if t.name() in PRE_ONLY_INPUTS and (text or t.name() != "text_input")]
    if not text:  # token ids in place of the text
        pre_inputs.append(_tensor(grpcclient, "input_ids", np.asarray([prompt], dtype=np.int32)))
    if content_spans is not None:
        pre_inputs.append(_tensor(grpcclient, "content_spans", np.asarray([content_spans], dtype=np.int32)))
    pre = await _call(client.infer(PREPROCESSING, pre_inputs,
                                   outputs=[grpcclient.InferRequestedOutput(n) for n in PRE_OUTPUTS],
                                   request_id=request_id, client_timeout=timeout_s), PREPROCESSING)
    router_inputs = [_tensor(grpcclient, n, pre.as_numpy(n)) for n in PRE_OUTPUTS]
    prompt_ids = pre.as_numpy("INPUT_ID").reshape(-1)
    router_inputs += [t for t in inputs if t.name() not in PRE_ONLY_INPUTS]
    finished = asyncio.Event()
    request = {"model_name": ROUTER, "inputs": router_inputs, "request_id": request_id,
               "parameters": {"triton_enable_empty_final_response": True}}

    async def requests():
        yield request
        await finished.wait()  # half-close only once the answer is complete

    call = client.stream_infer(requests(), stream_timeout=timeout_s)
    try:
        async for result, error in call:
            if error is not None:
                raise from_server(str(error))
            if result.as_numpy("OUTPUT_IDS") is not None:
                piece = await _post(client, grpcclient, result, request_id, timeout_s)
                piece.logprobs = _token_scores(result)
                piece.prompt_logprobs = _prompt_scores(result, prompt_ids)
                yield piece
            final = result.get_response().parameters.get(FINAL_FLAG)
            if final is not None and final.bool_param:
                return
        raise OpenAIError("the server closed the stream before the final response", status=502,
                          type="server_error")
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise OpenAIError(f"no complete answer within {timeout_s:g} s", status=504, type="server_error",
                              code="timeout") from exc
        detail = exc.details() if hasattr(exc, "details") else exc
        LOG.warning("the inference server is not reachable: %s: %s", code, detail)  # its address: log only
        raise unavailable(f"the inference server is not reachable ({code})") from exc
    finally:
        call.cancel()  # a no-op once the call has ended; otherwise the router cancels the request
        finished.set()


async def _post(client, grpcclient, result, request_id: str, timeout_s: float) -> Piece:
    """One router response through ``postprocessing``: its new text and the stats."""
    inputs = [_tensor(grpcclient, post, result.as_numpy(name)) for name, post in ROUTER_TO_POST.items()
              if result.as_numpy(name) is not None]
    out = await _call(client.infer(POSTPROCESSING, inputs, request_id=request_id, client_timeout=timeout_s),
                      POSTPROCESSING)
    text = out.as_numpy("text_output").reshape(-1)[0]
    stats = out.as_numpy("routing_stats").reshape(-1)[0]
    return Piece(text.decode("utf-8"), json.loads(stats))
