"""Helpers for the serving tests: call the router directly, read Triton statistics and metrics.

The router model is served on its own too (ensemble members are ordinary models), so a
test can send token ids and read token ids back (``router_tokens``): token-for-token
comparisons without a detokenizer in the way.
"""
from __future__ import annotations

import json
import queue
import re
import urllib.request

import numpy as np

ROUTER_KNOB_TYPES = {
    "max_tokens": (np.int32, "INT32"), "block_size": (np.int32, "INT32"), "rollback_window": (np.int32, "INT32"),
    "top_k": (np.int32, "INT32"), "END_ID": (np.int32, "INT32"), "stream": (bool, "BOOL"),
    "temperature": (np.float32, "FP32"), "top_p": (np.float32, "FP32"),
    "confidence_threshold": (np.float32, "FP32"), "entropy_threshold": (np.float32, "FP32"),
    "rollback_threshold": (np.float32, "FP32"), "draft_confidence_threshold": (np.float32, "FP32"),
    "ngram_drafts": (bool, "BOOL"), "light_copies": (bool, "BOOL"), "answer_cache": (bool, "BOOL"),
    "light_kv_window": (np.int32, "INT32"),
    "random_seed": (np.uint64, "UINT64"), "router_mode": (np.object_, "BYTES"), "block_schedule": (np.object_, "BYTES"),
}


def router_tokens(grpc_url: str, prompt_ids, stop_ids=None, on_response=None, **knobs) -> tuple[list[int], dict]:
    """Call the router model directly (gRPC stream); returns (generated ids, routing stats).

    ``on_response()`` runs after each response that carried tokens (a test's progress signal)."""
    import tritonclient.grpc as grpcclient

    def tensor(name, values, dtype, kind):
        arr = np.asarray(values, dtype=dtype).reshape(1, -1)
        t = grpcclient.InferInput(name, list(arr.shape), kind)
        t.set_data_from_numpy(arr)
        return t

    inputs = [tensor("INPUT_ID", list(prompt_ids), np.int32, "INT32")]
    if stop_ids is not None:
        inputs.append(tensor("STOP_IDS", stop_ids, np.int32, "INT32"))
    for name, value in knobs.items():
        dtype, kind = ROUTER_KNOB_TYPES[name]
        inputs.append(tensor(name, [value.encode() if dtype is np.object_ else value], dtype, kind))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tokens, stats = [], {}
    try:
        client.async_stream_infer("router", inputs)
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise RuntimeError(str(error))
            window = result.as_numpy("OUTPUT_IDS").reshape(-1).tolist()
            prefix = int(result.as_numpy("PREFIX_LEN").reshape(-1)[0])
            tokens += window[prefix:]
            if on_response is not None and window[prefix:]:
                on_response()
            stats = json.loads(result.as_numpy("ROUTING_STATS").reshape(-1)[0])
            if bool(result.as_numpy("IS_FINAL").reshape(-1)[0]):
                break
    finally:
        client.stop_stream()
        client.close()
    return tokens, stats


def model_stats(http_url: str, model: str) -> dict:
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/stats") as r:
        return json.loads(r.read())["model_stats"][0]


def scrape_metric(metrics_url: str, name: str, labels: dict[str, str]) -> float:
    """Value of one Prometheus sample (labels must match exactly the given subset)."""
    with urllib.request.urlopen(metrics_url) as r:  # TritonServer.metrics_url ends in /metrics
        text = r.read().decode()
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", line)
        if not m:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    raise KeyError(f"metric {name}{labels} not found")
