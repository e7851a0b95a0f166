"""The OpenAI-compatible front through the official ``openai`` client, against a real
tritonserver on the tiny pair: models, completions and chat (streamed and not), stop, seed,
router knobs, errors in OpenAI's shape, and a client that disconnects."""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest
import requests

from tokenrouter_backend.client.triton_client import generate_grpc
from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR
from tokenrouter_backend.openai_front.runner import OpenAIFront

pytestmark = pytest.mark.triton

openai = pytest.importorskip("openai")

# the tiny pair's tokenizer has no chat template: the tests bring a small one
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
PROMPT = "def fibonacci(n):\n    "
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def server(tiny_repository, start_triton_module):
    return start_triton_module(tiny_repository)


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "template.jinja"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def front(server, tiny_repository, template_file):
    config = FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR, template_file)
    with OpenAIFront(config, port=0) as running:
        yield running


@pytest.fixture(scope="module")
def client(front):
    return openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=120)


def stream_text(events, chat: bool) -> tuple[str, list]:
    events = list(events)
    pieces = [(e.choices[0].delta.content or "") if chat else e.choices[0].text for e in events if e.choices]
    return "".join(pieces), events


def test_models_lists_only_the_public_model(client):
    assert [m.id for m in client.models.list().data] == ["tokenrouter"]
    assert client.models.retrieve("tokenrouter").id == "tokenrouter"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("heavy")


def test_completion_matches_the_ensemble_streamed_or_not(client, server):
    direct = generate_grpc(server.grpc_url, PROMPT, max_tokens=12, router_mode="verify")
    done = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=12, extra_body={
        "router_mode": "verify"})
    assert done.choices[0].text == direct.text
    assert done.choices[0].finish_reason == ("length" if direct.stats["finish_reason"] == "length" else "stop")
    assert done.usage.completion_tokens == direct.stats["generated_tokens"]
    assert done.usage.prompt_tokens == direct.stats["prompt_tokens"] > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    assert done.model_extra["routing_stats"]["mode"] == "verify"
    text, events = stream_text(client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=12,
                                                          stream=True, stream_options={"include_usage": True}),
                               chat=False)
    assert text == direct.text
    finals = [e for e in events if e.choices and e.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == done.choices[0].finish_reason
    assert finals[0].model_extra["routing_stats"]["generated_tokens"] == done.usage.completion_tokens
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == done.usage.completion_tokens


def test_stream_is_sse_ending_with_done(front):
    resp = requests.post(f"{front.url}/completions", json={"model": "tokenrouter", "prompt": PROMPT,
                                                           "max_tokens": 6, "stream": True}, timeout=60)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [line for line in resp.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-1])


def test_echo_prepends_the_prompt(client):
    plain = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=5)
    echoed = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=5, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text


def test_chat_applies_the_template(client, tiny_repository, template_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_repository / TOKENIZER_DIR))
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True,
                                       chat_template=template_file.read_text())
    assert rendered.endswith("<assistant>")
    as_text = client.completions.create(model="tokenrouter", prompt=rendered, max_tokens=10)
    chat = client.chat.completions.create(model="tokenrouter", messages=MESSAGES, max_completion_tokens=10)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == as_text.choices[0].text
    assert chat.usage.prompt_tokens == as_text.usage.prompt_tokens
    text, events = stream_text(client.chat.completions.create(model="tokenrouter", messages=MESSAGES,
                                                              max_tokens=10, stream=True), chat=True)
    assert text == chat.choices[0].message.content
    assert events[0].choices[0].delta.role == "assistant"
    assert events[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_stop_ends_before_the_stop_string(client):
    full = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=32).choices[0].text
    word = full[10:13]
    assert len(word) == 3, f"the tiny model's answer is too short for this test: {full!r}"
    for stream in (False, True):
        got = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=32, stop=[word, "\x00"],
                                        stream=stream)
        if stream:
            text, events = stream_text(got, chat=False)
            reason = [e for e in events if e.choices[0].finish_reason][0].choices[0].finish_reason
        else:
            text, reason = got.choices[0].text, got.choices[0].finish_reason
        assert text == full[: full.index(word)] and reason == "stop"


def test_seed_reproduces_a_sampled_answer(client):
    def sample(seed):
        # fixed schedule: with the adaptive one the draft lengths follow the server's cost curves,
        # and speculative sampling's draws depend on the drafts
        return client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=16, temperature=1.5,
                                         top_p=1.0, seed=seed, extra_body={"block_schedule": "fixed"}).choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert len({first, sample(8), sample(9), sample(10)}) > 1, "four seeds gave one answer: seed is ignored"


def test_router_knobs_as_extra_body_fields(client):
    def run(**knobs):
        r = client.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=12, extra_body=knobs)
        return r.choices[0].text, r.model_extra["routing_stats"]

    heavy, heavy_stats = run(router_mode="heavy")
    # answer_cache off: the decision cache would draft heavy's answer to this prompt, no light drafts
    verify, verify_stats = run(router_mode="verify", block_size=3, block_schedule="fixed", answer_cache=False)
    assert verify == heavy and heavy_stats["mode"] == "heavy" and verify_stats["mode"] == "verify"
    assert heavy_stats["light_tokens"] == 0 and verify_stats["drafts_proposed"] > 0
    light, light_stats = run(router_mode="light")
    assert light_stats["light_tokens"] == light_stats["generated_tokens"] > 0
    # a threshold above 1 makes route behave exactly as verify
    route, route_stats = run(router_mode="route", confidence_threshold=1.5)
    assert route == heavy and route_stats["mode"] == "route"


@pytest.mark.parametrize("kwargs, status, param", [
    ({"n": 17}, 400, "n"),
    ({"model": "heavy"}, 404, None),
    ({"temperature": 5.0}, 400, "temperature"),
    ({"max_tokens": 100000}, 400, "max_tokens"),
    ({"extra_body": {"router_mode": "fast"}}, 400, "router_mode"),
    ({"extra_body": {"confidence_threshold": 7.0}}, 400, "confidence_threshold"),
    ({"extra_body": {"frobnicate": 1}}, 400, "frobnicate"),
    ({"logprobs": 6}, 400, "logprobs"),
    ({"stream": True, "extra_body": {"router_mode": "fast"}}, 400, "router_mode"),
])
def test_errors_have_openai_shape_and_status(client, kwargs, status, param):
    args = {"model": "tokenrouter", "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as info:
        result = client.completions.create(**args)
        list(result) if kwargs.get("stream") else None
    err = info.value
    assert err.status_code == status
    assert set(err.body) >= {"message", "type", "param", "code"}
    if param is not None:
        assert err.body["param"] == param and param in err.body["message"]


def test_bad_json_and_unknown_route(front):
    bad = requests.post(f"{front.url}/completions", data="{not json", timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    missing = requests.get(f"{front.url}/engines", timeout=30)
    assert missing.status_code == 404 and "message" in missing.json()["error"]


def test_chat_without_a_template_is_refused_by_name(server, tiny_repository):
    config = FrontConfig(server.grpc_url, tiny_repository / TOKENIZER_DIR)
    with OpenAIFront(config, port=0) as bare:
        plain = openai.OpenAI(base_url=bare.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            plain.chat.completions.create(model="tokenrouter", messages=MESSAGES, max_tokens=4)
        assert info.value.body["code"] == "chat_template_missing" and "chat template" in info.value.body["message"]
        assert plain.completions.create(model="tokenrouter", prompt=PROMPT, max_tokens=3).usage.completion_tokens


def metric_sum(metrics_url: str, name: str, **labels) -> float:
    with urllib.request.urlopen(metrics_url) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def wait_for(predicate, timeout_s=30.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def live_sessions(server) -> float:
    return metric_sum(server.metrics_url, "tokenrouter_kv_sessions")


def cancelled(server) -> float:
    return metric_sum(server.metrics_url, "tokenrouter_router_requests_total", finish_reason="cancelled")


def raw_post(front, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection((front.host, front.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_the_triton_stream(front, server, stream):
    before = cancelled(server)
    sock = raw_post(front, {"model": "tokenrouter", "prompt": PROMPT, "max_tokens": 900, "stream": stream,
                            "router_mode": "verify"})
    if stream:
        received = b""
        while b"data: {" not in received:  # the answer is under way
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection: {received!r}"
            received += chunk
    else:
        assert wait_for(lambda: live_sessions(server) > 0, 30), "the request never started"
    sock.close()
    assert wait_for(lambda: cancelled(server) == before + 1), "the router never saw the request cancelled"
    assert wait_for(lambda: live_sessions(server) == 0), f"sessions left behind: {live_sessions(server)}"


def test_openai_subcommand_serves_beside_a_running_server(server, tiny_repository, template_file, client):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter_backend", "openai", "--triton-grpc", server.grpc_url,
                             "--repository", str(tiny_repository), "--chat-template", str(template_file),
                             "--port", "0"], env=dict(os.environ, PYTHONPATH=str(root)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in proc.stdout:
            if line.startswith("  OpenAI"):
                break
        found = re.search(r"OpenAI +(http://127\.0\.0\.1:\d+/v1)", line)
        assert found, line + proc.stderr.read()
        sidecar = openai.OpenAI(base_url=found.group(1), api_key="unused", max_retries=0, timeout=120)
        answer = sidecar.chat.completions.create(model="tokenrouter", messages=MESSAGES, max_tokens=6)
        same = client.chat.completions.create(model="tokenrouter", messages=MESSAGES, max_tokens=6)
        assert answer.choices[0].message.content == same.choices[0].message.content
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
