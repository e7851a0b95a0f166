"""OpenAI response bodies and stream chunks for both endpoints.

``usage`` comes from the router's ``routing_stats`` (``prompt_tokens``, ``generated_tokens``);
``finish_reason`` is ``length`` when ``max_tokens`` ended the answer, ``stop`` for the end token,
a document-end token or a stop string. The full routing stats travel in the extension field
``routing_stats``, beside the one answer they describe: on the body of a response with one
choice, on each choice of a completion with several prompts (``choices[i].routing_stats``),
and on the chunk that carries a choice's ``finish_reason`` in a stream (a chunk holds one
choice). With several prompts ``usage`` sums them all.
"""
from __future__ import annotations

import enum
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, Sequence

PUBLIC_MODEL = "tokenrouter"
STATS_FIELD = "routing_stats"
DONE = "data: [DONE]\n\n"


class Endpoint(enum.Enum):
    COMPLETION = "text_completion"
    CHAT = "chat.completion"

    @property
    def id_prefix(self) -> str:
        return "cmpl" if self is Endpoint.COMPLETION else "chatcmpl"

    @property
    def chunk_object(self) -> str:
        return "text_completion" if self is Endpoint.COMPLETION else "chat.completion.chunk"


def finish_reason(stats: dict) -> str:
    return "length" if stats.get("finish_reason") == "length" else "stop"


def usage(*stats: dict) -> dict:
    """The token counts of one answer, or the sum over several."""
    prompt = sum(int(s.get("prompt_tokens", 0)) for s in stats)
    completion = sum(int(s.get("generated_tokens", 0)) for s in stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass
class Reply:
    """One request's response identity; builds its body or its stream chunks."""

    endpoint: Endpoint
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{self.endpoint.id_prefix}-{uuid.uuid4().hex}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": PUBLIC_MODEL,
                "system_fingerprint": None}

    def body(self, text: str, stats: dict, logprobs: Optional[dict] = None) -> dict:
        """The non-streamed response of one prompt (``logprobs``: its choice's, ``logprobs.py``)."""
        return self.batch_body([(text, stats)], [logprobs])

    def batch_body(self, answers: Sequence[tuple[str, dict]],
                   logprobs: Optional[Sequence[Optional[dict]]] = None,
                   generated: Optional[Sequence[dict]] = None) -> dict:
        """The non-streamed response: one choice per (text, stats) answer, in order, with its
        ``logprobs`` (``logprobs.py``; None: not asked); ``usage`` sums ``generated`` (the stats
        of every generation, ``best_of``'s unreturned ones too) or else the answers'."""
        choices = []
        logprobs = logprobs or [None] * len(answers)
        for index, ((text, stats), scores) in enumerate(zip(answers, logprobs)):
            if self.endpoint is Endpoint.COMPLETION:
                choice = {"index": index, "text": text, "logprobs": scores, "finish_reason": finish_reason(stats)}
            else:
                choice = {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
                          "logprobs": scores, "finish_reason": finish_reason(stats)}
            if len(answers) > 1:
                choice[STATS_FIELD] = stats
            choices.append(choice)
        spent = generated if generated is not None else [s for _, s in answers]
        body = {**self._head(self.endpoint.value), "choices": choices, "usage": usage(*spent)}
        if len(answers) == 1:
            body[STATS_FIELD] = answers[0][1]
        return body

    def chunk(self, text: str, stats: Optional[dict] = None, first: bool = False, index: int = 0,
              logprobs: Optional[dict] = None) -> str:
        """One SSE event of choice ``index``; ``stats`` given = its last chunk (finish_reason and
        routing stats); ``logprobs``: this chunk's tokens' (``logprobs.py``)."""
        reason = finish_reason(stats) if stats is not None else None
        if self.endpoint is Endpoint.COMPLETION:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        else:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        event = {**self._head(self.endpoint.chunk_object), "choices": [choice]}
        if stats is not None:
            event[STATS_FIELD] = stats
        return sse(event)

    def usage_chunk(self, *stats: dict) -> str:
        """``stream_options.include_usage``: the extra last chunk with no choices and the usage
        (summed over the choices)."""
        return sse({**self._head(self.endpoint.chunk_object), "choices": [], "usage": usage(*stats)})


def sse(event: dict) -> str:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n"


def models_list(created: int) -> dict:
    return {"object": "list", "data": [model_card(created)]}


def model_card(created: int) -> dict:
    return {"id": PUBLIC_MODEL, "object": "model", "created": created, "owned_by": "tokenrouter"}
