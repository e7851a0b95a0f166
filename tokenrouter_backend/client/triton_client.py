"""Talk to the ``tokenrouter`` ensemble: HTTP /generate and /generate_stream, gRPC streaming.

``GenerationResult`` carries the text, the routing stats, and client-side timings (time to
first token, end-to-end). One function per transport; both take the same knobs.
"""
from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

MODEL = "tokenrouter"
KNOBS_INT = ("max_tokens", "top_k", "block_size", "rollback_window", "end_id", "light_kv_window", "top_log_probs",
             "min_tokens")
KNOBS_FLOAT = ("temperature", "top_p", "min_p", "confidence_threshold", "entropy_threshold",
               "rollback_threshold", "draft_confidence_threshold", "dynamic_threshold_quantile",
               "router_threshold", "presence_penalty", "frequency_penalty", "repetition_penalty")
KNOBS_STR = ("router_mode", "block_schedule", "cache_salt")
INT_RANGES = {"INT32": (-(1 << 31), (1 << 31) - 1), "UINT64": (0, (1 << 64) - 1)}
KNOBS_BOOL = ("decision_log", "allow_degradation", "ngram_drafts", "light_copies", "answer_cache", "show_routing",
              "learned_router", "return_log_probs", "return_prompt_log_probs", "ignore_eos")


@dataclass
class GenerationResult:
    text: str
    stats: dict
    ttft_s: float
    latency_s: float
    chunks: list[str] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)  # seconds from the request to each chunk
    logprobs: "LogprobsOut" = field(default_factory=lambda: LogprobsOut())  # return_log_probs: per answer token

    @property
    def inter_token_gaps(self) -> list[float]:
        """Seconds between consecutive streamed chunks (inter-token latency when streaming)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tokens(self) -> int:
        return int(self.stats.get("generated_tokens", 0))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.latency_s if self.latency_s > 0 else 0.0


@dataclass
class LogprobsOut:
    """The answer tokens' log-probability outputs, gathered over the responses."""

    log_probs: list[float] = field(default_factory=list)
    branches: list[str] = field(default_factory=list)  # "heavy" / "light": whose number each is
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # top_log_probs: per token, best first
    cumulative: float | None = None
    prompt_log_probs: list[float] = field(default_factory=list)  # return_prompt_log_probs: prompt tokens 2..p
    prompt_top: list[list[tuple[int, float]]] = field(default_factory=list)

    def add(self, get: Callable[[str], Any]) -> None:
        """One response's outputs; ``get(name)`` -> a list / array or None."""
        lps = get("output_log_probs")
        if lps is None:
            return
        lps = [float(x) for x in np.asarray(lps, np.float32).reshape(-1)]
        self.log_probs += lps
        self.branches += [b.decode() if isinstance(b, bytes) else str(b)
                          for b in np.asarray(get("output_log_prob_branches"), dtype=object).reshape(-1)]
        self.top += top_lists(len(lps), get("output_top_ids"), get("output_top_log_probs"))
        self.cumulative = float(np.asarray(get("cum_log_probs")).reshape(-1)[0])
        prompt = get("prompt_log_probs")
        if prompt is not None:
            prompt = [float(x) for x in np.asarray(prompt, np.float32).reshape(-1)]
            self.prompt_log_probs += prompt
            self.prompt_top += top_lists(len(prompt), get("prompt_top_ids"), get("prompt_top_log_probs"))


def top_lists(n: int, ids, lps) -> list[list[tuple[int, float]]]:
    """n rows of (id, log-prob) alternatives from flat or [n, k] outputs."""
    ids, lps = np.asarray(ids if ids is not None else []), np.asarray(lps if lps is not None else [], np.float32)
    k = ids.size // n if n else 0
    ids, lps = ids.reshape(n, k), lps.reshape(n, k)
    return [list(zip(map(int, i), map(float, t))) for i, t in zip(ids, lps)]


class GenerationError(RuntimeError):
    """The server answered with an error (its message is kept verbatim)."""


def request_body(prompt: str, stream: bool, knobs: dict[str, Any]) -> dict:
    body = {"text_input": prompt, "stream": stream}
    body.update({k: v for k, v in knobs.items() if v is not None and k != "logit_bias"})
    if knobs.get("logit_bias"):  # {token id: bias} -> the two array inputs
        body.update(logit_bias_ids=[int(t) for t in knobs["logit_bias"]],
                    logit_bias_values=[float(b) for b in knobs["logit_bias"].values()])
    return body


def generate_http(url: str, prompt: str, stream: bool = False, timeout_s: float = 600,
                  on_chunk: Callable[[str], None] | None = None, **knobs) -> GenerationResult:
    """POST /v2/models/tokenrouter/generate (or generate_stream, SSE) on ``url`` (host:port).

    ``on_chunk``: streamed, called with each chunk's text as it arrives."""
    import requests

    endpoint = "generate_stream" if stream else "generate"
    start = time.perf_counter()
    resp = requests.post(f"http://{url}/v2/models/{MODEL}/{endpoint}", json=request_body(prompt, stream, knobs),
                         stream=stream, timeout=timeout_s)
    if not stream:
        data = resp.json()
        if resp.status_code != 200:
            raise GenerationError(data.get("error", resp.text))
        latency = time.perf_counter() - start
        result = GenerationResult(data["text_output"], json.loads(data["routing_stats"]), latency, latency,
                                  [data["text_output"]])
        result.logprobs.add(data.get)
        return result
    logprobs = LogprobsOut()
    chunks, stats, times = [], {}, []
    for line in resp.iter_lines():
        if not line or not line.startswith(b"data:"):
            continue
        data = json.loads(line[5:])
        if "error" in data:
            raise GenerationError(data["error"])
        times.append(time.perf_counter() - start)
        chunks.append(data["text_output"])
        if on_chunk is not None:
            on_chunk(data["text_output"])
        stats = json.loads(data["routing_stats"])
        logprobs.add(data.get)
    if resp.status_code != 200:
        raise GenerationError(resp.text)
    ttft = times[0] if times else 0.0
    return GenerationResult("".join(chunks), stats, ttft, time.perf_counter() - start, chunks, times, logprobs)


def grpc_inputs(grpcclient, prompt: str, stream: bool, knobs: dict[str, Any]):
    """The ensemble's input tensors (``grpcclient``: ``tritonclient.grpc`` or its ``aio``)."""

    def tensor(name, value, dtype, triton_type):
        if triton_type in INT_RANGES:  # numpy would wrap 2**32 + 5 to 5 (or overflow) without a word
            low, high = INT_RANGES[triton_type]
            if isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}] (a {triton_type} input); "
                                 f"got {value!r}")
        t = grpcclient.InferInput(name, [1, 1], triton_type)
        t.set_data_from_numpy(np.array([[value]], dtype=dtype))
        return t

    inputs = [tensor("text_input", prompt.encode(), np.object_, "BYTES"), tensor("stream", stream, bool, "BOOL")]
    for k, v in knobs.items():
        if v is None:
            continue
        if k in KNOBS_INT:
            inputs.append(tensor(k, int(v), np.int32, "INT32"))
        elif k in KNOBS_FLOAT:
            inputs.append(tensor(k, float(v), np.float32, "FP32"))
        elif k in KNOBS_STR:
            inputs.append(tensor(k, str(v).encode(), np.object_, "BYTES"))
        elif k in KNOBS_BOOL:
            inputs.append(tensor(k, bool(v), bool, "BOOL"))
        elif k == "random_seed":
            inputs.append(tensor(k, int(v), np.uint64, "UINT64"))
        elif k == "logit_bias":  # {token id: bias}
            for name, values, dtype, kind in (("logit_bias_ids", list(v), np.int32, "INT32"),
                                               ("logit_bias_values", list(v.values()), np.float32, "FP32")):
                t = grpcclient.InferInput(name, [1, len(values)], kind)
                t.set_data_from_numpy(np.array([values], dtype=dtype))
                inputs.append(t)
        elif k == "stop_token_ids":
            t = grpcclient.InferInput(k, [1, len(v)], "INT32")
            t.set_data_from_numpy(np.array([list(v)], dtype=np.int32))
            inputs.append(t)
        elif k == "stop_words":
            t = grpcclient.InferInput("stop_words", [1, len(v)], "BYTES")
            t.set_data_from_numpy(np.array([[w.encode() for w in v]], dtype=np.object_))
            inputs.append(t)
        else:
            raise ValueError(f"unknown knob {k!r}")
    return inputs


def generate_grpc(url: str, prompt: str, stream: bool = True, timeout_s: float = 600, client=None,
                  **knobs) -> GenerationResult:
    """gRPC bidirectional stream (the only gRPC way to reach a decoupled model)."""
    import tritonclient.grpc as grpcclient

    own = client is None
    client = client or grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    start = time.perf_counter()
    chunks, stats, times = [], {}, []
    logprobs = LogprobsOut()
    try:
        client.async_stream_infer(MODEL, grpc_inputs(grpcclient, prompt, stream, knobs),
                                  enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=timeout_s)
            if error is not None:
                raise GenerationError(str(error))
            response = result.get_response()
            out = result.as_numpy("text_output")
            if out is not None:
                times.append(time.perf_counter() - start)
                chunks.append(out.reshape(-1)[0].decode("utf-8"))
                stats = json.loads(result.as_numpy("routing_stats").reshape(-1)[0])
                logprobs.add(result.as_numpy)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream()
        if own:
            client.close()
    ttft = times[0] if times else 0.0
    return GenerationResult("".join(chunks), stats, ttft, time.perf_counter() - start, chunks, times, logprobs)
