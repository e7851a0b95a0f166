"""The serving path through a real tritonserver on the tiny pair: modes, batching, streaming,
bad input, cancellation, stops — what a user of the ensemble would check."""
from __future__ import annotations

import concurrent.futures as cf
import json
import queue
import time

import numpy as np
import pytest
import requests

from support.serving_helpers import model_stats, router_tokens, scrape_metric
from tokenrouter_backend.client.triton_client import generate_grpc, generate_http

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

PROMPTS = [
    "def fibonacci(n):\n    ", "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n    ", "def read_file(path):\n    with open(", "# Sort a list of numbers\n",
    "if __name__ == '__main__':\n", "def add(a, b):\n    return", "x = [1, 2, 3]\nprint(", "try:\n    import json\n",
    "def is_prime(n):\n", "while True:\n    line = ", "return self.", "def __repr__(self):\n        return",
    "raise ValueError(", "lambda x: x", "data = {'a': 1, ", "def main():\n    args = ", "self.assertEqual(",
    "from collections import",
]


@pytest.fixture(scope="module")
def tiny_repo(tiny_repository):
    return tiny_repository


@pytest.fixture(scope="module")
def server(tiny_repo, start_triton_module):
    return start_triton_module(tiny_repo)


@pytest.fixture(scope="module")
def tokenizer(tiny_repo):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def ids(tokenizer, text):
    return tokenizer.encode(text).ids


def test_verify_equals_heavy_token_for_token(server, tokenizer):
    url = server.grpc_url
    jobs = []
    with cf.ThreadPoolExecutor(4) as pool:
        for prompt in PROMPTS:
            p = ids(tokenizer, prompt)
            jobs.append((prompt, "heavy", pool.submit(router_tokens, url, p, router_mode="heavy", max_tokens=24)))
            for k, schedule in ((1, "fixed"), (3, "fixed"), (5, "heuristic")):
                jobs.append((prompt, f"verify k={k}", pool.submit(
                    router_tokens, url, p, router_mode="verify", max_tokens=24, block_size=k, block_schedule=schedule)))
    ref = {}
    accepted = 0
    for prompt, arm, fut in jobs:
        tokens, stats = fut.result()
        if arm == "heavy":
            ref[prompt] = tokens
            assert stats["heavy_tokens"] == len(tokens) == 24
    for prompt, arm, fut in jobs:
        tokens, stats = fut.result()
        assert tokens == ref[prompt], f"{arm} differs from heavy on {prompt!r}"
        accepted += stats["drafts_accepted"]
    assert accepted > 0, "the tiny light model never agreed with the heavy one: verify was not exercised"


def test_route_answer_is_the_same_for_every_block_size_under_other_traffic(server, tokenizer):
    """Route decides each position by the same per-token rule however its drafts are cut into
    blocks (tests/test_route_partition.py): block sizes 1..7, run four at a time beside heavy
    and verify requests, give one answer per prompt while their heavy checks differ."""
    knobs = dict(router_mode="route", max_tokens=32, block_schedule="fixed", confidence_threshold=0.05,
                 draft_confidence_threshold=0.0, rollback_threshold=0.05, answer_cache=False)
    jobs = []
    with cf.ThreadPoolExecutor(4) as pool:
        for prompt in PROMPTS[:8]:
            p = ids(tokenizer, prompt)
            for k in (1, 2, 4, 7):
                jobs.append((prompt, pool.submit(router_tokens, server.grpc_url, p, block_size=k, **knobs)))
                other = "heavy" if k % 2 else "verify"  # unrelated traffic between them
                pool.submit(router_tokens, server.grpc_url, p[::-1], router_mode=other, max_tokens=16)
    answers: dict[str, list] = {}
    for prompt, fut in jobs:
        answers.setdefault(prompt, []).append(fut.result())
    light = heavy = 0
    for prompt, runs in answers.items():
        texts = [tokens for tokens, _ in runs]
        assert all(t == texts[0] for t in texts), f"route's answer to {prompt!r} depends on the block size"
        assert len({s["heavy_calls"] for _, s in runs}) > 1 or len({s["light_calls"] for _, s in runs}) > 1
        light += runs[0][1]["light_tokens"]
        heavy += runs[0][1]["heavy_tokens"]
    assert light > 0 and heavy > 0, "the answers should mix light tokens and heavy ones"


def test_route_limits_equal_light_and_verify(server, tokenizer):
    for prompt in PROMPTS[:6]:
        p = ids(tokenizer, prompt)
        heavy, _ = router_tokens(server.grpc_url, p, router_mode="heavy", max_tokens=1)
        # heavy_first (streamed): the heavy model's first token, then every light token stands
        # unchecked; one heavy forward vouches for the answer before it ends: at
        # rollback_threshold 0 it can only end it early, where heavy's choice is to end
        # block_schedule fixed: the cost model keeps the request's blocks (it would plan heavy steps)
        route0, stats0 = router_tokens(server.grpc_url, p, router_mode="route", max_tokens=20, stream=True,
                                       confidence_threshold=0.0, rollback_threshold=0.0, block_schedule="fixed")
        assert route0[:1] == heavy
        light, _ = router_tokens(server.grpc_url, p + heavy, router_mode="light", max_tokens=19)
        assert stats0["heavy_calls"] == 2 and route0[1:] == light[: len(route0) - 1]
        assert route0[1:] == light or stats0["finish_reason"] == "end_id"
        verify, _ = router_tokens(server.grpc_url, p, router_mode="verify", max_tokens=20)
        route_hi, stats_hi = router_tokens(server.grpc_url, p, router_mode="route", max_tokens=20,
                                           confidence_threshold=1.5, block_schedule="fixed")
        # not streamed: the first heavy forward prefills the prompt and checks the first block
        assert route_hi == verify and stats_hi["verify_blocks"] == stats_hi["heavy_calls"]


def test_concurrent_requests_batch_and_match_sequential(server, tokenizer):
    prompts = [ids(tokenizer, p) for p in PROMPTS[:8]]
    sequential = [router_tokens(server.grpc_url, p, router_mode="verify", max_tokens=16)[0] for p in prompts]
    before = model_stats(server.http_url, "heavy")
    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(router_tokens, server.grpc_url, p, router_mode="verify", max_tokens=16) for p in prompts]
        concurrent = [f.result()[0] for f in futures]
    after = model_stats(server.http_url, "heavy")
    assert concurrent == sequential
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert executions < inferences, f"no batching: {inferences} requests in {executions} executions"
    assert any(int(b["batch_size"]) > 1 for b in after["batch_stats"])


def test_streams_complete_and_short_ones_finish_first(server):
    lengths = [4, 48, 8, 40, 12, 32, 6, 24]
    prompt = PROMPTS[0]
    reference = {n: generate_http(server.http_url.replace("http://", ""), prompt, max_tokens=n,
                                  router_mode="verify").text for n in set(lengths)}
    done_at = {}

    def one(i, n):
        result = generate_grpc(server.grpc_url, prompt, stream=True, max_tokens=n, router_mode="verify")
        done_at[i] = time.perf_counter()
        return result

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8), lengths))
    for n, result in zip(lengths, results):
        assert result.text == reference[n] and result.stats["generated_tokens"] == n
        assert len(result.chunks) >= 2, "streaming should deliver several chunks"
    order = sorted(range(8), key=done_at.get)
    shortest, longest = lengths.index(4), lengths.index(48)
    assert order.index(shortest) < order.index(longest)


def test_http_generate_stream_and_grpc_agree(server):
    host = server.http_url.replace("http://", "")
    plain = generate_http(host, PROMPTS[2], max_tokens=20, router_mode="route")
    streamed = generate_http(host, PROMPTS[2], stream=True, max_tokens=20, router_mode="route")
    grpc = generate_grpc(server.grpc_url, PROMPTS[2], stream=True, max_tokens=20, router_mode="route")
    assert plain.text == streamed.text == grpc.text and plain.text
    assert plain.stats["generated_tokens"] == 20
    for key in ("light_tokens", "heavy_tokens", "light_calls", "heavy_calls", "drafts_proposed", "drafts_accepted",
                "rollbacks", "light_ms", "heavy_ms", "router_overhead_ms"):
        assert key in plain.stats


BAD_INPUTS = [
    ({"max_tokens": -1}, "max_tokens must be in [1, 4096]; got -1"),
    ({"max_tokens": 100000}, "max_tokens must be in [1, 4096]; got 100000"),
    ({"router_mode": "fast"}, "router_mode must be one of heavy, light, verify, route; got 'fast'"),
    ({"confidence_threshold": -0.5}, "confidence_threshold must be in [0.0, 2.0]; got -0.5"),
    ({"rollback_threshold": 3.0}, "rollback_threshold must be in [0.0, 1.0]; got 3.0"),
    ({"block_size": 0}, "block_size must be in [1, 16]; got 0"),
    ({"text_input": ""}, "text_input must be a non-empty string"),
    ({"text_input": "x " * 3000, "max_tokens": 64}, "must fit the context of"),
    ({"text_input": "é" * (512 * 1024) + "x"}, "text_input is 1048577 bytes; at most max_input_bytes = 1048576"),
    ({"stop_words": [str(i) for i in range(17)]}, "stop_words has 17 entries; at most 16 allowed"),
    ({"stop_words": ["ok", "x" * 1025]}, "stop_words[1] is 1025 bytes; at most 256 characters"),
]


@pytest.mark.parametrize("body,message", BAD_INPUTS, ids=[m[:30] for _, m in BAD_INPUTS])
def test_bad_input_names_field_and_server_keeps_serving(server, body, message):
    full = {"text_input": "def f():", "max_tokens": 8, **body}
    r = requests.post(f"{server.http_url}/v2/models/tokenrouter/generate", json=full, timeout=60)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    ok = generate_http(server.http_url.replace("http://", ""), "def f():", max_tokens=4)
    assert ok.stats["generated_tokens"] == 4


def test_wrong_json_type_fails_and_server_keeps_serving(server):
    # Triton's HTTP JSON parser rejects this before any model runs; its message (not ours)
    # does not name the field, so only the refusal and continued service are asserted here.
    r = requests.post(f"{server.http_url}/v2/models/tokenrouter/generate",
                      json={"text_input": "def f():", "max_tokens": "ten"}, timeout=60)
    assert r.status_code != 200 and "error" in r.json()
    again = generate_http(server.http_url.replace("http://", ""), "def f():", max_tokens=4)
    assert again.stats["generated_tokens"] == 4


def test_wrong_dtype_is_named(server):
    import tritonclient.grpc as grpcclient

    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"def f():"]], dtype=np.object_))
    bad = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    bad.set_data_from_numpy(np.array([[8.0]], dtype=np.float32))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error))
    try:
        client.async_stream_infer("tokenrouter", [text, bad])
        error = results.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None and "max_tokens" in str(error) and "FP32" in str(error)


def test_cancelled_stream_releases_sessions(server, tokenizer):
    """A client that cancels its stream to the router stops the request between blocks and
    frees both sessions. (Through the ``tokenrouter`` ensemble, Triton 2.51 does not pass a
    stream's cancellation on to the router step: docs/operations.md, "Cancellation".)"""
    import tritonclient.grpc as grpcclient

    prompt = ids(tokenizer, PROMPTS[0])
    inputs = []
    tensors = (("INPUT_ID", prompt, np.int32, "INT32"), ("max_tokens", [900], np.int32, "INT32"),
               ("stream", [True], bool, "BOOL"), ("router_mode", [b"verify"], np.object_, "BYTES"))
    for name, value, dtype, kind in tensors:
        arr = np.asarray(value, dtype=dtype).reshape(1, -1)
        t = grpcclient.InferInput(name, list(arr.shape), kind)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    cancelled = {"finish_reason": "cancelled", "mode": "verify"}

    def cancelled_count():
        try:
            return scrape_metric(server.metrics_url, "tokenrouter_router_requests_total", cancelled)
        except KeyError:
            return 0.0

    before = cancelled_count()
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("router", inputs)
    result, error = got.get(timeout=60)  # at least one chunk arrived: the request is mid-generation
    assert error is None and not bool(result.as_numpy("IS_FINAL").reshape(-1)[0])
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        live = [scrape_metric(server.metrics_url, "tokenrouter_kv_sessions", {"branch": b}) for b in ("heavy", "light")]
        if live == [0.0, 0.0] and cancelled_count() > before:
            break
        time.sleep(0.2)
    assert live == [0.0, 0.0], f"sessions left behind after cancel: heavy/light = {live}"
    assert cancelled_count() == before + 1, "the router did not see the cancellation (it ran to max_tokens)"
    ok = generate_http(server.http_url.replace("http://", ""), "def f():", max_tokens=4)
    assert ok.stats["generated_tokens"] == 4


def test_stop_words_and_end_id(server, tokenizer):
    host = server.http_url.replace("http://", "")
    full = generate_http(host, PROMPTS[0], max_tokens=32, router_mode="verify")
    token_ids = ids(tokenizer, PROMPTS[0])
    gen, _ = router_tokens(server.grpc_url, token_ids, router_mode="verify", max_tokens=32)
    # end_id: the 6th generated token ends the answer just before its first occurrence
    end = gen[5]
    cut, stats = router_tokens(server.grpc_url, token_ids, router_mode="verify", max_tokens=32, END_ID=end)
    assert cut == gen[: gen.index(end)] and stats["finish_reason"] == "end_id"
    # stop word: a piece of the full answer's text; the answer stops before it
    word = full.text[10:14]
    stopped = generate_http(host, PROMPTS[0], max_tokens=32, router_mode="verify", stop_words=[word])
    assert stopped.stats["finish_reason"] == "stop_words", stopped.stats
    assert word not in stopped.text and full.text.startswith(stopped.text)
    assert stopped.text == full.text[: full.text.find(word)]


def _mid_token_stop(server, tokenizer, knobs):
    """(prompt, stop string, expected answer): the stop string starts inside a generated token
    and ends inside the next one (or at its end, where no answer has two such neighbours)."""
    loose = None
    for prompt in PROMPTS[:8]:
        gen, _ = router_tokens(server.grpc_url, ids(tokenizer, prompt), **knobs)
        text = tokenizer.decode(gen, skip_special_tokens=True)
        ends = [len(tokenizer.decode(gen[: k + 1], skip_special_tokens=True)) for k in range(len(gen))]
        starts = [0] + ends[:-1]  # token k's text is text[starts[k]:ends[k]]
        pairs = [k for k in range(len(gen) - 1) if ends[k] - starts[k] >= 2 and ends[k + 1] > ends[k]]
        for k in pairs:
            word = text[starts[k] + 1 : ends[k] + 1]
            found = (prompt, word, text[: text.find(word)])
            if ends[k + 1] - ends[k] >= 2:
                return found
            loose = loose or found
    assert loose, "no generated token with two characters"
    return loose


def test_stop_string_inside_tokens_streams_nothing_past_it(server, tokenizer):
    """A stop string that starts inside one generated token and ends inside the next."""
    for mode in ("verify", "route", "heavy"):
        knobs = {"router_mode": mode, "max_tokens": 32, "rollback_threshold": 0.0}
        prompt, word, want = _mid_token_stop(server, tokenizer, knobs)
        for stream in (False, True):
            got = generate_grpc(server.grpc_url, prompt, stream=stream, stop_words=[word], **knobs)
            assert got.text == want and got.stats["finish_reason"] == "stop_words", (mode, stream, word, got)
            # each streamed chunk only ever extends the answer: nothing was taken back
            assert all(want.startswith("".join(got.chunks[: k + 1])) for k in range(len(got.chunks)))
    bad = requests.post(f"{server.http_url}/v2/models/tokenrouter/generate",
                        json={"text_input": "def f():", "max_tokens": 4, "stop_words": ["x", ""]}, timeout=60)
    assert bad.status_code != 200 and "stop_words[1] must be a non-empty string" in bad.text


def test_sampling_is_reproducible_with_seed(server):
    """The documented promise (docs/configuration.md, random_seed): heavy text depends only on
    (seed, position); a sampled verify answer repeats with ``block_schedule: fixed`` (the
    adaptive schedule's draft lengths follow the server's measured costs, and speculative
    sampling's draws compare the drafts, so there it may not)."""
    host = server.http_url.replace("http://", "")
    sampled = {"max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "random_seed": 7}
    for knobs in ({"router_mode": "verify", "block_schedule": "fixed"}, {"router_mode": "heavy"}):
        a = generate_http(host, PROMPTS[4], **sampled, **knobs)
        b = generate_http(host, PROMPTS[4], **sampled, **knobs)
        assert a.text == b.text and a.stats["generated_tokens"] == 16, knobs


def test_tensorrt_llm_client_fields_are_accepted(server, tokenizer):
    # what genai-perf (--backend tensorrtllm) sends besides the basics
    body = {"text_input": "def f():", "max_tokens": 6, "stream": False, "exclude_input_in_output": True}
    r = requests.post(f"{server.http_url}/v2/models/tokenrouter/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["routing_stats"])["generated_tokens"] == 6
    # the completion alone, no echoed prompt: the same server's plain answer, and the text of
    # exactly the tokens its router generates for this prompt
    plain = generate_http(server.http_url.replace("http://", ""), "def f():", max_tokens=6)
    generated, _ = router_tokens(server.grpc_url, ids(tokenizer, "def f():"), max_tokens=6)
    assert r.json()["text_output"] == plain.text == tokenizer.decode(generated)


def test_document_end_tokens_from_config_stop_generation(server, tokenizer, tiny_repo, tmp_path, start_triton):
    """preprocessing's stop_token_ids (exporter-filled, e.g. Qwen's <|endoftext|>) end answers."""
    import re
    import shutil

    gen, _ = router_tokens(server.grpc_url, ids(tokenizer, PROMPTS[0]), router_mode="verify", max_tokens=32)
    end = gen[5]
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    config = repo / "preprocessing" / "config.pbtxt"
    text = re.sub(r'(key: "stop_token_ids" value: \{ string_value: ")[^"]*(")', rf"\g<1>{end}\g<2>", config.read_text())
    config.write_text(text)
    other = start_triton(repo)
    cut = generate_http(other.http_url.replace("http://", ""), PROMPTS[0], max_tokens=32, router_mode="verify")
    assert cut.stats["finish_reason"] == "stop_words" and cut.stats["generated_tokens"] == gen.index(end)
