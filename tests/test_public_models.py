"""Every public model bounded, through a real tritonserver (docs/security.md, "Public models").

Triton serves each model of the repository to any client, so ``preprocessing``,
``postprocessing`` and the ``router`` check their inputs themselves: a transport-scale input
is refused by name before any per-token work, while a parallel short stream keeps its idle
latency; a bad id or length is a named error, not a Python exception; a full queue is refused
at once and the server keeps serving.
"""
from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

from tokenrouter_backend.client.triton_client import generate_grpc, generate_http

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

PROMPT = "def f(x):\n    "
BIG_TOKENS = 10_000_000  # 40 MB of int32 ids
MANY_STOP_WORDS = 1_000_000
LATENCY_RATIO = 1.5  # a parallel stream's latency against its idle latency
SLACK_S = 0.15  # scheduling noise of a loaded machine on top of the ratio
COPY_ALLOWANCE_S = 0.5  # the Python backend copies a 40 MB input into shared memory before any model code
ROUNDS = 3


@pytest.fixture(scope="module")
def server(start_triton_module, tiny_repository):
    return start_triton_module(tiny_repository)


def _client(server):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=120.0,
                                            connection_timeout=120.0)


def _input(name, array):
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=True)
    return tensor


def postprocess(server, tokens, prefix=0, final=True, stats=b"{}", trim=None):
    """One direct postprocessing call: (text or the error message, seconds)."""
    inputs = [_input("TOKENS", np.asarray(tokens, dtype=np.int32).reshape(1, -1)),
              _input("PREFIX_LEN", np.array([[prefix]], dtype=np.int32)),
              _input("IS_FINAL", np.array([[final]], dtype=bool)),
              _input("ROUTING_STATS_IN", np.array([[stats]], dtype=np.object_))]
    if trim is not None:
        inputs.append(_input("STOP_TRIM", np.array([[trim]], dtype=np.int32)))
    return _infer(server, "postprocessing", inputs, "text_output")


def _infer(server, model, inputs, output):
    from tritonclient.utils import InferenceServerException

    start = time.perf_counter()
    try:
        result = _client(server).infer(model, inputs)
        value = result.as_numpy(output).reshape(-1)[0]
    except InferenceServerException as exc:
        value = exc.message()
    return value, time.perf_counter() - start


BIG_CALL = f"""
import sys
import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

def tensor(name, array, kind):
    t = httpclient.InferInput(name, list(array.shape), kind)
    t.set_data_from_numpy(array, binary_data=True)
    return t

dtype = sys.argv[2]  # INT32: refused by the model; FP32: by Triton, before any model code
inputs = [tensor("TOKENS", np.zeros((1, {BIG_TOKENS}), np.int32 if dtype == "INT32" else np.float32), dtype),
          tensor("PREFIX_LEN", np.array([[0]], np.int32), "INT32"), tensor("IS_FINAL", np.array([[True]]), "BOOL"),
          tensor("ROUTING_STATS_IN", np.array([[b"{{}}"]], object), "BYTES")]
try:
    httpclient.InferenceServerClient(sys.argv[1], network_timeout=300).infer("postprocessing", inputs)
    print("answered")
except InferenceServerException as exc:
    print(exc.message())
"""


def stream_latency(server) -> float:
    """Seconds of one short greedy gRPC stream through the ensemble (which detokenizes in postprocessing)."""
    return generate_grpc(server.grpc_url, PROMPT, stream=True, max_tokens=8, timeout_s=120).latency_s


def compute_s(server, model: str = "postprocessing") -> float:
    """Seconds ``model``'s instances have spent on requests so far (Triton's statistics)."""
    import requests

    stats = requests.get(f"{server.http_url}/v2/models/{model}/stats", timeout=30).json()["model_stats"]
    return sum(int(s["inference_stats"][part]["ns"]) for s in stats
               for part in ("compute_input", "compute_infer", "compute_output")) / 1e9


def worst_stream_beside(server, dtype: str) -> tuple[float, str]:
    """The worst latency of short streams run back to back while a 40 MB ``TOKENS`` call (sent
    from another process, whose client must not hold this one's GIL) is in flight; its answer."""
    big = subprocess.Popen([sys.executable, "-c", BIG_CALL, server.http_url.removeprefix("http://"), dtype],
                           stdout=subprocess.PIPE, text=True)
    beside = [stream_latency(server)]
    while big.poll() is None:
        beside.append(stream_latency(server))
    return max(beside), big.communicate(timeout=300)[0]


def test_a_40mb_tokens_window_is_refused_fast_and_streams_keep_their_latency(server):
    """The 40 MB call is refused by name without decoding (the instance is busy a small share of
    what decoding it would take, measured here on the longest legal window), and a parallel
    stream's worst latency beside it stays within 1.5x of its worst beside the same body sent as
    FP32, which Triton refuses before any model code (the transfer alone), plus the Python
    backend's copy of 40 MB into its shared memory (which no model code can avoid)."""
    tokens = np.zeros(BIG_TOKENS, dtype=np.int32)
    before = compute_s(server)
    answer, _ = postprocess(server, tokens)  # the first one also grows the backend's shared memory to 40 MB
    first_s = compute_s(server) - before
    cap = re.search(r"at most (\d+) allowed", str(answer))
    window = int(cap.group(1)) if cap else 1024  # max_window_tokens (the tiny pair's max_context)
    before = compute_s(server)
    for _ in range(3):
        postprocess(server, np.arange(window, dtype=np.int32) % 200 + 5)
    decode_s = (compute_s(server) - before) / 3 * BIG_TOKENS / window  # what decoding 10^7 ids would take
    before = compute_s(server)
    answer, big_s = postprocess(server, tokens)  # alone: how long it holds the one instance
    held_s = compute_s(server) - before
    stream_latency(server)  # warm up
    worst: dict[str, list[float]] = {"model": [], "transport": [], "idle": []}
    answers = [str(answer)]
    for _ in range(ROUNDS):  # interleaved, so each kind sees the same machine load
        latency, text = worst_stream_beside(server, "INT32")
        worst["model"].append(latency)
        answers.append(text)
        latency, text = worst_stream_beside(server, "FP32")
        worst["transport"].append(latency)
        assert "TOKENS" in text and "FP32" in text  # refused by Triton before the model
        worst["idle"].append(max(stream_latency(server) for _ in range(8)))
    model, transport, idle = (statistics.median(worst[k]) for k in ("model", "transport", "idle"))
    print(f"\n40 MB TOKENS to postprocessing: answered in {big_s:.3f} s, the instance busy {held_s:.3f} s "
          f"(first call {first_s:.3f} s; decoding it would take about {decode_s:.1f} s); "
          f"a parallel stream's worst latency (median of {ROUNDS} rounds): "
          f"beside it {model:.3f} s, beside the transfer alone {transport:.3f} s, idle {idle:.3f} s "
          f"(ratios {model / transport:.2f}, {model / idle:.2f}); rounds {worst}")
    assert held_s < decode_s / 10  # refused by the instance: no 10^7 ids decoded
    assert model <= LATENCY_RATIO * transport + COPY_ALLOWANCE_S
    assert all(f"TOKENS has {BIG_TOKENS} entries; at most" in answer for answer in answers), answers[0][:200]


@pytest.mark.parametrize("call, message", [
    (dict(tokens=[-1, 5]), r"TOKENS\[0\] is -1; token ids must be in \[0, \d+\]"),
    (dict(tokens=[5, 1 << 30]), r"TOKENS\[1\] is 1073741824; token ids must be in \[0, \d+\]"),
    (dict(tokens=[5, 6], prefix=3), r"PREFIX_LEN must be in \[0, 2\]; got 3"),
    (dict(tokens=[5, 6], prefix=-1), r"PREFIX_LEN must be in \[0, 2\]; got -1"),
    (dict(tokens=[5, 6], trim=-2), r"STOP_TRIM must be in \[0, 2147483647\]; got -2"),
    (dict(tokens=[5], stats=b"x" * (1 << 20 | 1)),
     r"ROUTING_STATS_IN is 1048577 bytes; at most max_routing_stats_bytes = 1048576"),
])
def test_postprocessing_refuses_bad_inputs_by_name(server, call, message):
    answer, _ = postprocess(server, **call)
    assert re.search(message, str(answer)), answer
    text, _ = postprocess(server, [5, 6, 7])
    assert isinstance(text, bytes)  # and keeps serving


def _router_refusal(server, stop_words) -> tuple[str, float]:
    """A direct router call (decoupled: a gRPC stream); its answer and seconds from send to answer."""
    import queue

    import tritonclient.grpc as grpcclient

    arrays = {"INPUT_ID": np.array([[5, 6, 7]], dtype=np.int32), "max_tokens": np.array([[2]], dtype=np.int32),
              "stop_words": np.asarray(stop_words, dtype=np.object_).reshape(1, -1)}
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        start = time.perf_counter()
        client.async_stream_infer("router", inputs)
        answer = answers.get(timeout=120)
        return str(answer), time.perf_counter() - start
    finally:
        client.stop_stream()
        client.close()


def test_a_million_stop_words_are_refused_by_count_before_they_are_read(server):
    many = [b"w"] * MANY_STOP_WORDS
    few = [b"w"] * 17  # refused by the same count check: the baseline of transport and answer
    timings = {"many": [], "few": []}
    for _ in range(3):
        for name, words in (("few", few), ("many", many)):
            answer, seconds = _router_refusal(server, words)
            assert f"stop_words has {len(words)} entries; at most 16 allowed" in answer
            timings[name].append(seconds)
    many_s, few_s = statistics.median(timings["many"]), statistics.median(timings["few"])
    print(f"\n10^6 stop_words to the router: refused in {many_s:.3f} s (17 stop words: {few_s:.3f} s)")
    # the transfer of 5 MB stays; the per-element deserialization (seconds here) is gone
    assert many_s < few_s + 0.5


def test_a_full_queue_is_refused_at_once_and_the_server_keeps_serving(start_triton, tiny_repository, tmp_path):
    """postprocessing with a queue of one and a window cap raised so that one slow request holds
    its one instance: one more request waits, the next is refused at once by Triton."""
    repository = tmp_path / "repository"
    shutil.copytree(tiny_repository, repository, symlinks=True)
    config = repository / "postprocessing" / "config.pbtxt"
    text = config.read_text()
    assert "max_queue_size: 1024" in text  # the template's default
    text = re.sub(r'(key: "max_window_tokens" value: \{ string_value: )"\d+"', r'\1"100000000"', text)
    config.write_text(text.replace("max_queue_size: 1024", "max_queue_size: 1"))
    server = start_triton(repository)
    slow = np.full(BIG_TOKENS // 2, 5, dtype=np.int32)  # seconds of decoding on the one instance
    refusals = []
    with cf.ThreadPoolExecutor(4) as pool:
        held = pool.submit(postprocess, server, slow)
        time.sleep(1.0)  # its transfer is done: it runs
        waiting = []
        while not held.done() and len(waiting) < 3 and not refusals:
            waiting.append(pool.submit(postprocess, server, [5, 7]))
            time.sleep(0.3)
            for job in waiting:
                if job.done() and "Exceeds maximum queue size" in str(job.result()[0]):
                    refusals.append(job.result()[1])
        held_text, held_s = held.result(timeout=300)
        answers = [job.result(timeout=60) for job in waiting]
    refusals += [seconds for answer, seconds in answers if "Exceeds maximum queue size" in str(answer)]
    print(f"\nqueue of 1: refused in {min(refusals or [float('nan')]):.3f} s while one request held the "
          f"instance {held_s:.1f} s")
    assert refusals and min(refusals) < held_s / 4  # at once, not after the request that holds the instance
    assert isinstance(held_text, bytes) and any(isinstance(answer, bytes) for answer, _ in answers)
    host = server.http_url.removeprefix("http://")
    assert generate_http(host, PROMPT, max_tokens=4, timeout_s=120).tokens > 0
