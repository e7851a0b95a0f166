"""The served tokenizer: text → token ids by ``preprocessing``, token ids → text by ``postprocessing``.

``/tokenize``, ``/detokenize`` (vLLM's endpoints) and the echo of a token-id prompt call the
served models themselves rather than a tokenizer loaded in the front, because that makes the
ids ``/tokenize`` gives the ids generation gets, by construction: the same tokenizer file on
the same server, the same chat-content rule (``content_spans``), the same caps and refusals
(a prompt generation would refuse is refused here with the same message), also where the
front runs beside a server whose repository it cannot read (``tokenrouter openai`` without
``--repository``); and a text decodes as the answers' text does (special tokens skipped).
``max_model_len`` is the router's ``max_context`` (prompt + answer), read once from the
repository's router config (null when the front runs without the repository).
"""
from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .chat_template import TOKENIZER_DIR
from .errors import OpenAIError
from .triton_stream import POSTPROCESSING, PREPROCESSING, ROUTER, _call, _tensor

MAX_CONTEXT = "max_context"  # the router's config parameter: prompt + answer, in tokens


def _request_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def _naming(err: OpenAIError, param: str) -> OpenAIError:
    """A refusal of the request (400) names the field it came from."""
    return dataclasses.replace(err, param=param) if err.status == 400 else err


async def token_ids(client, text: str, add_special_tokens: bool, timeout_s: float, param: str,
                    content_spans: Optional[list[int]] = None) -> list[int]:
    """``text`` as ``preprocessing`` tokenizes it for generation (``content_spans``: a chat
    prompt's message contents, as the chat endpoint sends them)."""
    import tritonclient.grpc.aio as grpcclient

    inputs = [_tensor(grpcclient, "text_input", np.array([[text.encode("utf-8")]], dtype=np.object_)),
              _tensor(grpcclient, "add_special_tokens", np.array([[add_special_tokens]], dtype=bool))]
    if content_spans is not None:
        inputs.append(_tensor(grpcclient, "content_spans", np.asarray([content_spans], dtype=np.int32)))
    try:
        out = await _call(client.infer(PREPROCESSING, inputs, outputs=[grpcclient.InferRequestedOutput("INPUT_ID")],
                                       request_id=_request_id("tokenize"), client_timeout=timeout_s), PREPROCESSING)
    except OpenAIError as err:
        raise _naming(err, param) from err
    return out.as_numpy("INPUT_ID").reshape(-1).tolist()


async def text_of(client, ids: Sequence[int], timeout_s: float, param: str) -> str:
    """The text of ``ids`` as ``postprocessing`` decodes an answer (one final window)."""
    import tritonclient.grpc.aio as grpcclient

    if not ids:
        return ""
    inputs = [_tensor(grpcclient, "TOKENS", np.asarray([ids], dtype=np.int32)),
              _tensor(grpcclient, "PREFIX_LEN", np.array([[0]], dtype=np.int32)),
              _tensor(grpcclient, "IS_FINAL", np.array([[True]], dtype=bool)),
              _tensor(grpcclient, "ROUTING_STATS_IN", np.array([[b"{}"]], dtype=np.object_))]
    try:
        out = await _call(client.infer(POSTPROCESSING, inputs, request_id=_request_id("detokenize"),
                                       client_timeout=timeout_s), POSTPROCESSING)
    except OpenAIError as err:
        raise _naming(err, param) from err
    return out.as_numpy("text_output").reshape(-1)[0].decode("utf-8")


def repository_max_context(tokenizer_dir: Optional[Path]) -> Optional[int]:
    """The router's ``max_context`` in the model repository the exported tokenizer belongs to
    (``<repository>/preprocessing/1/tokenizer``); None without one. Read from the file, not
    asked of the server: model configs are an admin API there (``server/restrictions.py``)."""
    if tokenizer_dir is None:
        return None
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config_file = Path(tokenizer_dir).parents[len(TOKENIZER_DIR.parts) - 1] / ROUTER / "config.pbtxt"
    if not config_file.is_file():
        return None
    config = text_format.Parse(config_file.read_text(), model_config_pb2.ModelConfig())
    raw = config.parameters[MAX_CONTEXT].string_value if MAX_CONTEXT in config.parameters else ""
    return int(raw) if raw.strip().isdigit() else None
