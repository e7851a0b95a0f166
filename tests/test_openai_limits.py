"""The OpenAI front's limits at the door: body size, JSON depth, integer ranges, `messages`
and prompt sizes, parsing off the event loop, and a streaming client that stops reading.

The pure tests call ``parsing.parse`` (what a worker process runs) directly; the ``triton``
ones go through a real tritonserver on the tiny pair and the front over HTTP."""
from __future__ import annotations

import json
import select
import socket
import statistics
import threading
import time

import pytest
import requests

from tokenrouter_backend.openai_front.parsing import MAX_JSON_DEPTH, MAX_MESSAGES, Limits, parse
from tokenrouter_backend.openai_front.protocol import INT32_MAX, SEED_MAX

PROMPT = "def fibonacci(n):\n    "
USER = {"role": "user", "content": "hi"}


def completion(**fields) -> bytes:
    return json.dumps({"model": "tokenrouter", "prompt": "x", **fields}).encode()


def chat(**fields) -> bytes:
    return json.dumps({"model": "tokenrouter", "messages": [USER], **fields}).encode()


def refused(kind: str, data: bytes, max_prompt_bytes: int = 1 << 20) -> dict:
    parsed = parse(kind, data, max_prompt_bytes)
    assert isinstance(parsed, dict), f"accepted: {parsed!r}"[:300]
    assert parsed["status"] == 400 and parsed["type"] == "invalid_request_error"
    return parsed


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 2**32 + 5),  # arrived as 5 through the client's int32 cast
    ("max_tokens", 2**31),  # arrived as a negative number
    ("max_tokens", 10**20),  # OverflowError in the cast: a plain-text 500
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", True), ("max_tokens", 5.5), ("max_tokens", "5"),
    ("seed", -1), ("seed", SEED_MAX + 1), ("seed", False),
    ("n", 10**20), ("best_of", 2**40), ("logprobs", -(2**40)),
    ("top_k", 2**31), ("block_size", 2**32 + 1), ("rollback_window", -(2**31) - 1), ("light_kv_window", 10**30),
])
def test_integers_out_of_their_range_are_refused_by_name(field, value):
    err = refused("completion", completion(**{field: value}))
    assert err["param"] == field and field in err["message"]


def test_integer_bounds_are_the_inputs_ranges():
    for kind, data in [("completion", completion(max_tokens=INT32_MAX, seed=SEED_MAX, top_k=INT32_MAX)),
                       ("chat", chat(max_completion_tokens=INT32_MAX, top_logprobs=0))]:
        body = parse(kind, data, 1 << 20)
        assert not isinstance(body, dict), body
    assert refused("chat", chat(max_completion_tokens=INT32_MAX + 1))["param"] == "max_completion_tokens"


def test_int32_knobs_never_wrap_in_the_client():
    import tritonclient.grpc as grpcclient

    from tokenrouter_backend.client.triton_client import grpc_inputs

    for value in (2**32 + 5, 2**31, -(2**31) - 1, 10**20):
        with pytest.raises(ValueError, match=r"max_tokens must be an integer in \[-2147483648, 2147483647\]"):
            grpc_inputs(grpcclient, "x", False, {"max_tokens": value})
    with pytest.raises(ValueError, match="random_seed"):
        grpc_inputs(grpcclient, "x", False, {"random_seed": -1})
    kept = [t for t in grpc_inputs(grpcclient, "x", False, {"max_tokens": INT32_MAX}) if t.name() == "max_tokens"]
    assert len(kept) == 1


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_deep_nesting_is_refused_by_field_without_recursing():
    # the body is level 1, its field's value level 2
    assert not isinstance(parse("completion", completion(metadata={"a": nested(MAX_JSON_DEPTH - 3)}), 1 << 20), dict)
    err = refused("completion", completion(metadata={"a": nested(MAX_JSON_DEPTH - 1)}))
    assert err["param"] == "metadata" and f"deeper than {MAX_JSON_DEPTH}" in err["message"]
    # deeper than Python's recursion limit: json's RecursionError was a plain-text 500
    err = refused("completion", b'{"model": "tokenrouter", "prompt": "x", "metadata": ' + b"[" * 100_000)
    assert "deeper than" in err["message"]
    assert "deeper than" in refused("chat", b"[" * 100_000 + b"]" * 100_000)["message"]


def test_messages_and_prompt_sizes_are_capped():
    assert not isinstance(parse("chat", chat(messages=[USER] * MAX_MESSAGES), 1 << 20), dict)
    err = refused("chat", chat(messages=[USER] * (MAX_MESSAGES + 1)))
    assert (err["param"], err["code"]) == ("messages", "array_above_max_length")
    err = refused("chat", chat(messages=[{"role": "user", "content": "é" * 600}] * 2), max_prompt_bytes=2000)
    assert (err["param"], err["code"]) == ("messages", "string_above_max_length") and "2400 bytes" in err["message"]
    err = refused("completion", completion(prompt="a" * 2001), max_prompt_bytes=2000)
    assert (err["param"], err["code"]) == ("prompt", "string_above_max_length")
    assert not isinstance(parse("completion", completion(prompt="a" * 2000), 2000), dict)


@pytest.mark.parametrize("kind, data, param", [
    ("completion", b'{"model": "tokenrouter", "prompt": "\\ud800"}', "prompt"),  # no UTF-8 form
    ("completion", b'{"model": "tokenrouter", "prompt": "x", "stop": "\\udfff"}', "stop"),
    ("chat", b'{"model": "tokenrouter", "messages": [{"role": "user", "content": "\\ud83d"}]}', "messages"),
    ("completion", b"[1, 2]", None), ("completion", b"{not json", None), ("completion", b"\xff\xfe", None),
])
def test_bodies_that_cannot_become_a_prompt_are_refused(kind, data, param):
    assert refused(kind, data)["param"] == param


def test_ignored_fields_do_not_travel_back_from_the_worker():
    body = parse("chat", chat(metadata={str(i): "v" for i in range(1000)}, response_format={"type": "text"}), 1 << 20)
    assert not body.model_extra and body.response_format is None and body.knobs() == {}


def test_a_parser_process_that_dies_is_answered_503_and_replaced():
    import asyncio
    import glob

    from tokenrouter_backend.openai_front.errors import OpenAIError
    from tokenrouter_backend.openai_front.parsing import BodyParser

    big = completion(prompt="a" * 20_000)  # over INLINE_BODY_BYTES: parsed in a worker

    async def run():
        parser = BodyParser(Limits(parse_workers=1))
        await parser.start()
        try:
            assert (await parser.parse("completion", big)).prompt == "a" * 20_000
            for process in list(parser._pool._processes.values()):
                process.kill()
            with pytest.raises(OpenAIError) as info:
                await parser.parse("completion", big)
            assert info.value.status == 503
            assert (await parser.parse("completion", big)).prompt == "a" * 20_000  # a new pool
        finally:
            parser.close()

    asyncio.run(run())
    assert not glob.glob("/dev/shm/tokenrouter-body-*"), "a body file was left behind"


def test_limits_refuse_nonsense():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_body_bytes"):
            Limits(max_body_bytes=bad)


# --- through a real tritonserver -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


def start_front(server, **config):
    from tokenrouter_backend.openai_front.app import FrontConfig
    from tokenrouter_backend.openai_front.runner import OpenAIFront

    return OpenAIFront(FrontConfig(server.grpc_url, **config), port=0).start()


@pytest.fixture(scope="module")
def front(server):
    running = start_front(server)
    yield running
    running.stop()


def post(front, data: bytes, path: str = "/completions", **kwargs) -> requests.Response:
    return requests.post(f"{front.url}{path}", data=data, headers={"Content-Type": "application/json"},
                         timeout=120, **kwargs)


def assert_openai_error(resp: requests.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:300]
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


pytestmark_triton = pytest.mark.triton


@pytestmark_triton
@pytest.mark.parametrize("data, param", [
    (completion(prompt=PROMPT, max_tokens=2**32 + 5), "max_tokens"),
    (completion(prompt=PROMPT, max_tokens=2**31), "max_tokens"),
    (completion(prompt=PROMPT, max_tokens=10**20), "max_tokens"),
    (completion(prompt=PROMPT, max_tokens=3, top_k=2**32 + 1), "top_k"),
    (completion(prompt=PROMPT, max_tokens=3, metadata={"a": nested(40)}), "metadata"),
    # past Python's recursion limit (a RecursionError: a plain-text 500 before)
    (b'{"model": "tokenrouter", "prompt": "x", "metadata": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", None),
    (b"[" * 50_000, None),
])
def test_refusals_are_openai_errors_over_http(front, data, param):
    error = assert_openai_error(post(front, data), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def raw_request(front, head: bytes, body: bytes = b"", rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((front.host, front.port))
    sock.sendall(head + body)
    return sock


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line + headers and the body of one HTTP answer (with a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(headers[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


@pytestmark_triton
def test_body_limit_refuses_before_reading(server):
    limit = 64 * 1024
    small = start_front(server, limits=Limits(max_body_bytes=limit))
    try:
        # a declared 400 MB body: answered at once, nothing of it sent
        start = time.monotonic()
        sock = raw_request(small, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 400000000\r\n\r\n")
        head, rest = read_response(sock)
        sock.close()
        refused_s = time.monotonic() - start
        assert refused_s < 1 and head.startswith(b"HTTP/1.1 413")
        error = json.loads(rest)["error"]
        assert error["code"] == "content_too_large" and str(limit) in error["message"]
        # chunked (no Content-Length): counted as it arrives, refused once past the limit
        sock = raw_request(small, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 4096
        sent = 0
        while not select.select([sock], [], [], 0.01)[0]:  # until the server answers
            assert sent < 100 * limit, "no answer to a chunked body 100 times the limit"
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        head, answer = read_response(sock)
        sock.close()
        assert head.startswith(b"HTTP/1.1 413") and json.loads(answer)["error"]["code"] == "content_too_large"
        print(f"declared 400 MB: 413 in {refused_s * 1e3:.0f} ms; chunked: 413 after {sent} bytes sent (limit {limit})")
        at_limit = completion(prompt=PROMPT, max_tokens=2)
        at_limit = at_limit[:-1] + b" " * (limit - len(at_limit)) + b"}"
        assert len(at_limit) == limit and post(small, at_limit).status_code == 200
        assert_openai_error(post(small, at_limit + b" "), 413)
    finally:
        small.stop()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@pytestmark_triton
def test_parsing_a_large_body_does_not_stall_other_requests(front):
    """A short streamed request's latency while a 7 MiB body is parsed stays within 1.5x of its
    idle latency, measured in the same test, interleaved: the body is parsed in a worker process,
    not on the event loop (there, json.loads of this body alone held it ~0.5 s). Only requests
    that ended while the large body was still being parsed count as "while parsing"."""
    keys = 390_000
    big = json.dumps({"model": "not-served", "prompt": "x", "metadata": {f"k{i:06d}": i for i in range(keys)}}).encode()
    assert 6 << 20 < len(big) < 8 << 20  # the default max_body_bytes is 8 MiB
    short = completion(prompt=PROMPT, max_tokens=2, stream=True)

    def short_request():
        resp = post(front, short)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")

    parsed = []

    def large_request():
        parsed.append(post(front, big).status_code)

    short_request()  # warm
    idle, busy = [], []
    deadline = time.monotonic() + 120
    while (len(idle) < 24 or len(busy) < 24) and time.monotonic() < deadline:
        idle += [timed(short_request) for _ in range(4)]
        sender = threading.Thread(target=large_request)
        sender.start()
        time.sleep(0.4)  # received: being parsed
        while sender.is_alive() and len(busy) < 24:
            took = timed(short_request)
            if sender.is_alive():
                busy.append(took)
        sender.join(120)
    assert len(busy) >= 8, f"too few requests ended while a large body was parsed: {len(busy)}"
    assert parsed and set(parsed) == {404}, parsed  # every large body was read and parsed whole
    ratio = statistics.median(busy) / statistics.median(idle)
    print(f"short request: idle median {statistics.median(idle) * 1e3:.1f} ms, while parsing "
          f"{statistics.median(busy) * 1e3:.1f} ms (x{ratio:.2f}); {len(idle)}/{len(busy)} requests, "
          f"{len(parsed)} large bodies")
    assert ratio <= 1.5, f"idle {sorted(idle)}, while parsing {sorted(busy)}"


def metric_sum(server, name: str, **labels) -> float:
    text = requests.get(server.metrics_url, timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytestmark_triton
def test_a_client_that_stops_reading_loses_its_stream_and_nobody_waits(server):
    """A streaming client that stops reading: once a send has waited ``stream_stall_s`` the front
    cancels its generation (the router counts it cancelled, its KV sessions go) and ends the
    response without ``[DONE]``; meanwhile other clients of the same front are answered."""
    stall_s = 2.0
    front = start_front(server, stream_stall_s=stall_s, stream_buffer_bytes=8192)
    short = completion(prompt=PROMPT, max_tokens=2, stream=True)

    def short_request():
        resp = post(front, short)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")

    def cancelled() -> float:
        return metric_sum(server, "tokenrouter_router_requests_total", finish_reason="cancelled")

    try:
        idle = [timed(short_request) for _ in range(3)]
        before = cancelled()
        data = completion(prompt=PROMPT, max_tokens=1000, stream=True, router_mode="heavy")
        sock = raw_request(front, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  + b"Content-Length: %d\r\n\r\n" % len(data), data, rcvbuf=4096)
        received = b""
        while b"data: {" not in received:  # the answer is under way; from now on nothing is read
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        stalled_at = time.monotonic()
        during = [timed(short_request) for _ in range(3)]  # answered while the stalled stream is held
        assert wait_for(lambda: cancelled() == before + 1, 120), "the stalled stream's generation was not cancelled"
        took = time.monotonic() - stalled_at
        assert wait_for(lambda: metric_sum(server, "tokenrouter_kv_sessions") == 0, 30), "KV sessions left"
        sock.settimeout(30)
        while chunk := sock.recv(65536):  # what was sent before the stall, then the end of the connection
            received += chunk
        sock.close()
        assert b"data: [DONE]" not in received
        events = received.count(b"data: {")
        print(f"stalled stream cancelled {took:.1f} s after the client stopped reading ({events} events had been "
              f"sent, {len(received)} bytes); short requests meanwhile {statistics.median(during) * 1e3:.0f} ms, "
              f"idle {statistics.median(idle) * 1e3:.0f} ms")
    finally:
        front.stop()
