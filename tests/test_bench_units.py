"""Bench harness pieces without a server: workloads, quality, HumanEval scoring, pairing, load data."""
from __future__ import annotations

import json
import subprocess

import pytest

from tokenrouter_backend.bench import load
from tokenrouter_backend.bench.bench import make_arms
from tokenrouter_backend.bench.quality import compare_tokens, humaneval_passed, truncate_humaneval
from tokenrouter_backend.bench.records import RunRecord
from tokenrouter_backend.bench.scoring import paired_ratios, spread, summarize
from tokenrouter_backend.bench.workloads import ALL_WORKLOADS, HUMANEVAL, humaneval_problems, load_workloads


def test_workloads_have_ids_and_names():
    prompts = load_workloads(ALL_WORKLOADS)
    assert len({p.id for p in prompts}) == len(prompts)
    assert {p.workload for p in prompts} == set(ALL_WORKLOADS)
    assert sum(p.workload == "code" for p in prompts) >= 10
    quick = load_workloads(ALL_WORKLOADS, quick=True)
    assert len(quick) == 2 * len(ALL_WORKLOADS)
    assert len(load_workloads([HUMANEVAL], full=True)) == 164
    with pytest.raises(ValueError, match="nope"):
        load_workloads(["nope"])


def test_humaneval_scores_correct_and_wrong_completions():
    problem = humaneval_problems()[0]            # has_close_elements
    correct = ("    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
               "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n")
    wrong = "    return False\n"
    assert humaneval_passed(problem, correct)
    assert not humaneval_passed(problem, wrong)
    # text after the function (a new top-level def) is cut before execution
    assert humaneval_passed(problem, correct + "\ndef junk(:\n")
    assert not humaneval_passed(problem, "    while True:\n        pass\n", timeout_s=1.0)


def test_truncate_humaneval():
    assert truncate_humaneval("    return 1\n\nif __name__ == '__main__':\n    x") == "    return 1\n"


def test_compare_tokens():
    same = compare_tokens([1, 2, 3], [1, 2, 3])
    assert same.exact_match and same.token_agreement == 1.0 and same.common_prefix_tokens == 3
    diff = compare_tokens([1, 2, 9, 4], [1, 2, 3])
    assert not diff.exact_match
    assert diff.token_agreement == pytest.approx(2 / 4)
    assert diff.common_prefix_tokens == 2
    assert 0 < diff.seq_agreement < 1


def _rec(arm, prompt, tps, lat=1.0, workload="code"):
    r = RunRecord(arm, prompt, workload, 0, 0)
    r.tokens_per_s, r.latency_s, r.tokens = tps, lat, 10
    return r


def test_ratios_are_paired_per_prompt():
    recs = [_rec("heavy", "a", 1.0), _rec("verify", "a", 2.0), _rec("heavy", "b", 10.0), _rec("verify", "b", 10.0)]
    ratios = paired_ratios(recs)
    by_prompt = {x["prompt_id"]: x["speedup"] for x in ratios if x["arm"] == "verify"}
    assert by_prompt == {"a": 2.0, "b": 1.0}   # unpaired medians would give 6.0/5.5
    s = summarize(recs, ratios)
    assert s["all"]["verify"]["speedup"]["heavy"]["median"] == pytest.approx(1.5)
    assert s["all"]["verify"]["speedup"]["heavy"]["n"] == 2


def test_spread():
    s = spread([1, 2, 3, 4, 5])
    assert (s["median"], s["q25"], s["q75"], s["n"]) == (3, 2, 4, 5)
    assert spread([])["median"] is None


def test_make_arms_threshold_sweep():
    arms = make_arms(["heavy", "route"], [0.5, 0.9], ("hf_heavy",))
    assert [a.name for a in arms] == ["heavy", "route@0.5", "route@0.9", "hf_heavy"]
    assert arms[2].knobs == {"router_mode": "route", "confidence_threshold": 0.9, "learned_router": False}
    extra = make_arms(["router", "request"], [], ())
    assert [(a.name, a.knobs) for a in extra] == [("router", {"router_mode": "route", "learned_router": True}),
                                                  ("request", {})]
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        make_arms(["fast"], [], ())
    frontier = make_arms(["router"], [], (), router_thresholds=(0.3, 0.5))
    assert [a.name for a in frontier] == ["router", "router@0.3", "router@0.5"]
    assert frontier[1].knobs == {"router_mode": "route", "learned_router": True, "router_threshold": 0.3}
    with pytest.raises(ValueError, match=r"--router-thresholds: 1.5 is not a P\(disagree\) bar"):
        make_arms(["router"], [], (), router_thresholds=(1.5,))


def test_perf_input_data_shape():
    prompts = load_workloads(["code"], quick=True)
    data = load.input_data(prompts, "verify", 16, {"confidence_threshold": 0.8})
    assert len(data["data"]) == 2
    row = data["data"][0]
    assert row["text_input"] == [prompts[0].text] and row["max_tokens"] == [16]
    assert row["router_mode"] == ["verify"] and row["stream"] == [True] and row["confidence_threshold"] == [0.8]
    json.dumps(data)


def test_point_from_csv_row():
    row = {"Concurrency": "2", "Inferences/Second": "0.5", "p50 latency": "2000000", "p99 latency": "4000000",
           "Client Send": "10", "Network+Server Send/Recv": "2500000", "Client Recv": "5"}
    p = load.point_from_row("heavy", 2, 32, row)
    assert p.throughput_rps == 0.5 and p.tokens_per_s == 16 and p.p99_latency_ms == 4000.0


def test_a_measurement_window_holds_at_least_one_request_per_request_in_flight(monkeypatch, tmp_path):
    assert [load.point_window(4, c) for c in (1, 2, 4, 8, 16)] == [4, 4, 4, 8, 16]
    seen = {}

    def fake_run(cmd, **_):  # perf_analyzer itself is driven in test_bench.py
        seen["count"] = int(cmd[cmd.index("--measurement-request-count") + 1])
        raise subprocess.TimeoutExpired(cmd, 0)

    monkeypatch.setattr(load.subprocess, "run", fake_run)
    prompts = load_workloads(["code"], quick=True)
    with pytest.raises(subprocess.TimeoutExpired):
        load.run_point("127.0.0.1:1", prompts, "heavy", 16, 4, tmp_path, window_requests=4)
    assert seen["count"] == 16
