"""Pure pieces of the real-traffic benchmarks: the mixed workload, stream timing, RAG prompts."""
import json

from tokenrouter_backend.bench.load import mixed_prompts, stream_timing
from tokenrouter_backend.bench.traffic import rag_prompt
from tokenrouter_backend.bench.workloads import Prompt


def test_mixed_prompts_hold_the_share_spread_out():
    short = [Prompt(f"s{i}", "code", "x") for i in range(3)]
    long = [Prompt("l", "rag", "y" * 5000)]
    mix = mixed_prompts(short, long, 0.25)
    assert len(mix) == 8 and sum(p.workload == "rag" for p in mix) == 2
    assert [p.workload for p in mix].index("rag") < 4  # not both at the end
    assert mixed_prompts(short, long, 0.0) == short


def test_stream_timing_splits_short_and_long(tmp_path):
    ms = 1_000_000
    requests = [
        {"timestamp": 0, "request_inputs": {"text_input": "def f():"}, "response_timestamps": [100 * ms, 150 * ms]},
        {"timestamp": 0, "request_inputs": {"text_input": "z" * 3000}, "response_timestamps": [900 * ms, 1000 * ms,
                                                                                              1200 * ms]},
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"experiments": [{"experiment": {"mode": "concurrency", "value": 2},
                                                 "requests": requests}]}))
    t = stream_timing(path, frozenset({"z" * 3000}))
    assert t["short"]["ttft"]["max_ms"] == 100 and t["long"]["ttft"]["max_ms"] == 900
    assert t["long"]["itl"]["n"] == 2 and t["long"]["itl"]["max_ms"] == 200
    assert t["all"]["latency"]["max_ms"] == 1200


def test_rag_prompt_is_long_deterministic_and_ends_with_the_question():
    a, b = rag_prompt(1200), rag_prompt(1200)
    assert a == b and len(a) > 3000 and a.rstrip().endswith("def summary():")
    assert rag_prompt(1200, offset=1) != a


def test_markdown_table_has_ratios_to_heavy():
    from tokenrouter_backend.bench.load import markdown_table

    timing = {"all": {"ttft": {"p50_ms": 100.0, "p99_ms": 300.0}, "itl": {"p50_ms": 20.0, "p99_ms": 90.0}},
              "short": {"latency": {"max_ms": 900.0}}}
    base = {"p50_latency_ms": 500.0, "p99_latency_ms": 900.0, "timing": timing}
    points = [{"mode": "heavy", "concurrency": 2, "throughput_rps": 2.0, **base},
              {"mode": "verify", "concurrency": 2, "throughput_rps": 3.0, **base},
              {"mode": "route", "concurrency": 2, "error": "boom"}]
    table = markdown_table(points)
    assert "| verify | 2 | 3.000 | 1.50 | 0.5 / 0.9 | 0.1 / 0.3 | 20 / 90 | 0.9 | - |" in table
    assert "error: boom" in table


def _reuse_sample(workload, arm, rnd, kind, ttft, total, tps, text="x", reused=0):
    from tokenrouter_backend.bench.reuse import Sample

    return Sample(workload, arm, rnd, kind, ttft, total, 10, tps, reused, 0, 0, 0, text, {})


def test_reuse_tables_pair_cold_with_warm_and_arms_with_heavy():
    from tokenrouter_backend.bench.reuse import copy_table, reuse_table

    s = [_reuse_sample("reuse", "verify", 0, "cold", 40.0, 50.0, 1),
         _reuse_sample("reuse", "verify", 0, "warm", 4.0, 10.0, 1, reused=1300),
         _reuse_sample("reuse", "verify", 0, "warm", 8.0, 12.0, 1, reused=1300),
         _reuse_sample("reuse", "verify", 1, "cold", 20.0, 30.0, 1),
         _reuse_sample("reuse", "verify", 1, "warm", 2.0, 6.0, 1, reused=1300)]
    row = reuse_table(s)[0]
    assert abs(row["warm_over_cold_ttft"] - (6.0 / 40 + 2.0 / 20) / 2) < 1e-9  # per round, then mean
    assert row["warm_heavy_reused"] == 1300
    c = [_reuse_sample("copy", "heavy", 0, "copy", 1, 10, 2.0, "a"), _reuse_sample("copy", "verify+ngram", 0, "copy",
                                                                                   1, 3, 8.0, "a"),
         _reuse_sample("copy", "verify", 0, "copy", 1, 5, 5.0, "b")]
    rows = {r["arm"]: r for r in copy_table(c)}
    assert rows["verify+ngram"]["speedup_vs_heavy"] == 4.0 and rows["verify+ngram"]["identical_to_heavy"] == 1
    assert rows["verify"]["identical_to_heavy"] == 0


def test_rag_prompt_with_a_tokenizer_has_the_asked_length(tiny_repository):
    from tokenrouter_backend.bench.traffic import repo_tokenizer

    tok = repo_tokenizer(tiny_repository)
    for n in (300, 1200):
        prompt = rag_prompt(n, tokenizer=tok)
        assert abs(len(tok.encode(prompt, add_special_tokens=False).ids) - n) <= 2
        assert prompt.rstrip().endswith("def summary():")
