"""The demo's answers and its summary table stand out (client/demo.py), with the same requests."""
from __future__ import annotations

from tokenrouter_backend.client import demo
from tokenrouter_backend.client.triton_client import GenerationResult


def _fake_generate(calls):
    def generate(url, prompt, max_tokens, router_mode, answer_cache):
        assert answer_cache is False  # the modes share prompts: none may copy another's answer
        calls.append((url, prompt, max_tokens, router_mode))
        stats = {"generated_tokens": 3, "light_share": 0.5, "heavy_calls": 2, "drafts_accepted": 1,
                 "drafts_proposed": 2, "rollbacks": 0, "heavy_calls_per_token": 0.6667}
        return GenerationResult(f"    return {router_mode!r}\n", stats, 0.1, 0.5, [])
    return generate


def test_demo_prints_each_answer_behind_a_margin_then_an_aligned_table(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(demo, "generate_http", _fake_generate(calls))
    assert demo.main(["--url", "h:1", "--max-tokens", "7"]) == 0
    out = capsys.readouterr().out
    # the same requests as before: every prompt in every mode, in order
    assert calls == [("h:1", p, 7, m) for p in demo.DEMO_PROMPTS for m in demo.DEMO_MODES]
    lines = out.splitlines()
    headers = [line for line in lines if line.startswith("=== prompt ")]
    assert len(headers) == len(demo.DEMO_PROMPTS) * len(demo.DEMO_MODES)
    assert "=== prompt 1, mode verify: 3 tokens, 6.00 tok/s, light share 50%" in out
    for mode in demo.DEMO_MODES:  # the answer, prompt first, each line behind "  | "
        assert f"  |     return {mode!r}" in lines
    assert "  | def fibonacci(n: int) -> int:" in lines
    table = lines[lines.index(next(x for x in lines if x.startswith("=== summary"))) + 1:]
    assert table[0].split() == ["prompt", "mode", "tokens", "tok/s", "light", "share", "heavy", "calls/token"]
    assert set(table[1]) == {"-"} and len(table[1]) == len(table[0])
    rows = table[2:]
    assert len(rows) == len(headers) and all(len(r) == len(table[0]) for r in rows)
    assert rows[4].split() == ["2", "verify", "3", "6.00", "50%", "0.67"]


class _FakeResponse:
    status_code = 200

    def json(self):
        return {"choices": [{"message": {"content": "It builds a list.\nIn one line."}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 9}, "routing_stats": {"light_share": 0.25}}


def test_demo_asks_one_chat_question_through_the_openai_endpoint(monkeypatch, capsys):
    import requests

    calls, sent = [], []
    monkeypatch.setattr(demo, "generate_http", _fake_generate(calls))
    monkeypatch.setattr(requests, "post", lambda url, json, timeout: sent.append((url, json)) or _FakeResponse())
    assert demo.main(["--url", "h:1", "--openai-url", "http://h:2/v1"]) == 0
    out = capsys.readouterr().out
    (url, body), = sent
    assert url == "http://h:2/v1/chat/completions" and body["model"] == "tokenrouter"
    assert body["messages"] == [{"role": "user", "content": demo.CHAT_QUESTION}]
    assert "=== chat through the OpenAI endpoint (verify): 9 tokens in" in out and "light share 25%" in out
    assert f"  user      | {demo.CHAT_QUESTION}" in out.splitlines()
    assert "  assistant | It builds a list." in out.splitlines() and "  assistant | In one line." in out.splitlines()
    assert out.index("=== summary") < out.index("=== chat")
