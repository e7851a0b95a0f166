"""bench/arm_prompts.py: no prompt is shared between benchmark arms, and arms stay comparable."""
from __future__ import annotations

from tokenrouter_backend.bench.arm_prompts import NO_REUSE_KNOBS, for_arm, nonce


def test_arms_get_distinct_prompts_of_equal_length_and_content():
    text = "def add(a, b):\n"
    heavy, verify, again = for_arm(text, "mix", "heavy", 0, 1), for_arm(text, "mix", "verify", 0, 1), \
        for_arm(text, "mix", "heavy", 0, 1)
    assert heavy != verify and heavy == again  # distinct across arms, the same within one
    assert len(heavy) == len(verify) and heavy.endswith(text) and verify.endswith(text)
    assert heavy.split("\n")[0] != verify.split("\n")[0]  # they differ from the first line: no shared block
    assert len(nonce("a")) == len(nonce("b", 1, 2)) == 8
    assert NO_REUSE_KNOBS == {"answer_cache": False}


def test_traffic_and_load_send_arm_prompts(monkeypatch, tmp_path):
    from tokenrouter_backend.bench import load, traffic
    from tokenrouter_backend.bench.workloads import Prompt

    sent = []

    def fake_generate(url, prompt, **knobs):
        sent.append((prompt, knobs))
        raise RuntimeError("stop here")

    monkeypatch.setattr(traffic.triton_client, "generate_grpc", fake_generate)
    for mode in ("heavy", "verify"):
        try:
            traffic.run_case("x:1", "mix", [("short", "p")], mode, 4, 0, None)
        except RuntimeError:
            pass
    assert sent[0][0] != sent[1][0] and sent[0][0].endswith("p") and sent[0][1]["answer_cache"] is False

    written = {}
    monkeypatch.setattr(load, "write_input_data",
                        lambda path, prompts, mode, max_tokens, extra: written.setdefault(mode, (prompts, extra)))
    monkeypatch.setattr(load.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no run")))
    for mode in ("heavy", "route"):
        try:
            load.run_point("x:1", [Prompt("a", "code", "q")], mode, 1, 4, tmp_path, {"confidence_threshold": 0.8})
        except RuntimeError:
            pass
    assert written["heavy"][0][0].text != written["route"][0][0].text
    assert written["route"][1] == {"answer_cache": False, "confidence_threshold": 0.8}
