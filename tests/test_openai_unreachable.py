"""The OpenAI front without a reachable tritonserver: 503 in OpenAI's error shape, /health 503,
and the request checks that need no server still answer 400/404 (no tritonserver started)."""
from __future__ import annotations

import pytest
import requests

from tokenrouter_backend.openai_front.app import FrontConfig
from tokenrouter_backend.openai_front.runner import OpenAIFront
from tokenrouter_backend.server.ports import free_port


@pytest.fixture(scope="module")
def front():
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    with OpenAIFront(FrontConfig(nobody, request_timeout_s=10), port=0) as running:
        yield running


def test_unreachable_server_is_503(front):
    resp = requests.post(f"{front.url}/completions", json={"model": "tokenrouter", "prompt": "x"}, timeout=30)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    error = resp.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
    health = requests.get(f"{front.url.removesuffix('/v1')}/health", timeout=30)
    assert health.status_code == 503
    port = front.config.triton_grpc_url.rpartition(":")[2]
    for body in (resp.text, health.text):  # the server's address is for the front's log only
        assert port not in body and "127.0.0.1" not in body, body


def test_checks_that_need_no_server(front):
    wrong_model = requests.post(f"{front.url}/completions", json={"model": "gpt-4", "prompt": "x"}, timeout=30)
    assert wrong_model.status_code == 404 and wrong_model.json()["error"]["code"] == "model_not_found"
    no_prompt = requests.post(f"{front.url}/completions", json={"model": "tokenrouter"}, timeout=30)
    assert no_prompt.status_code == 400 and no_prompt.json()["error"]["param"] == "prompt"
    chat = requests.post(f"{front.url}/chat/completions", timeout=30,
                         json={"model": "tokenrouter", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_template_missing"
    assert requests.get(f"{front.url}/models", timeout=30).json()["data"][0]["id"] == "tokenrouter"
