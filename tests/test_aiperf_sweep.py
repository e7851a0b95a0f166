"""bench/aiperf_sweep.py and the bench's short-answer workload: the order, the AIPerf
command each point runs, the rows it reads back, and the chat prompts of the workload.

The sweep's runner is replaced by one that writes the export AIPerf would write (AIPerf
itself lives in its own venv, not in the test environment); the command it receives is
what a real run gets."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tokenrouter_backend.bench import aiperf_sweep, aiperf_table
from tokenrouter_backend.bench.short_answers import QUESTIONS, RAG_QUESTIONS, SHORT, SHORT_RAG, short_answer_prompts


def config(**kw) -> aiperf_sweep.SweepConfig:
    return aiperf_sweep.SweepConfig("http://127.0.0.1:9", Path("tok"), **kw)


def test_modes_run_back_to_back_per_concurrency_their_order_rotated():
    got = aiperf_sweep.order(config(concurrency=(1, 4, 16)))
    assert got == [("heavy", 1), ("verify", 1), ("route", 1), ("verify", 4), ("route", 4), ("heavy", 4),
                   ("route", 16), ("heavy", 16), ("verify", 16)]


def _flag(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, v in enumerate(cmd) if v == name]


def test_each_point_is_a_chat_stream_run_out_of_the_other_modes_caches():
    cmd = aiperf_sweep.command(config(per_stream=8), "verify", 4, Path("out/verify-c4"), "aiperf")
    assert cmd[:2] == ["aiperf", "profile"] and "--streaming" in cmd and "--use-server-token-count" in cmd
    assert _flag(cmd, "--endpoint-type") == ["chat"] and _flag(cmd, "--request-count") == ["32"]
    assert _flag(cmd, "--concurrency") == ["4"] and _flag(cmd, "--goodput") == [aiperf_sweep.DEFAULT_SLO]
    extras = _flag(cmd, "--extra-inputs")
    assert "router_mode:verify" in extras and "answer_cache:false" in extras
    salts = {e for e in extras if e.startswith("cache_salt:")}
    other = {e for e in _flag(aiperf_sweep.command(config(), "heavy", 4, Path("x"), "aiperf"), "--extra-inputs")
             if e.startswith("cache_salt:")}
    assert len(salts) == 1 and salts != other  # one salt per point: no KV block shared across modes
    with pytest.raises(ValueError):
        config(per_stream=0)


def _export(tokens_per_s: float) -> dict:
    stat = {"p50": 100.0, "p90": 200.0, "avg": 120.0}
    return {"request_count": {"avg": 8}, "time_to_first_token": stat, "inter_token_latency": {"avg": 50.0},
            "output_token_throughput": {"avg": tokens_per_s}, "request_throughput": {"avg": 0.5},
            "output_sequence_length": {"avg": 12.0}, "goodput": {"avg": 0.25}}


def test_sweep_runs_every_point_and_reads_its_rows(tmp_path, monkeypatch):
    monkeypatch.setenv(aiperf_sweep.AIPERF_ENV, "fake-aiperf")
    ran = []

    def run(cmd, stdout, stderr):
        ran.append(cmd)
        mode = next(e for e in _flag(cmd, "--extra-inputs") if e.startswith("router_mode:")).split(":")[1]
        art = Path(_flag(cmd, "--artifact-dir")[0])
        art.mkdir(parents=True)
        (art / aiperf_table.EXPORT).write_text(json.dumps(_export({"heavy": 2.0, "verify": 3.0}[mode])))
        return subprocess.CompletedProcess(cmd, 0)

    rows = aiperf_sweep.sweep(config(modes=("heavy", "verify"), concurrency=(1, 2)), tmp_path, lambda m: None, run)
    assert [c[0] for c in ran] == ["fake-aiperf"] * 4
    assert [(r["mode"], r["concurrency"], r["tokens_per_s_x_heavy"]) for r in rows] == [
        ("heavy", 1, 1.0), ("heavy", 2, 1.0), ("verify", 1, 1.5), ("verify", 2, 1.5)]
    assert rows[0]["goodput"] == 0.25


def test_a_failed_point_stops_the_sweep_with_aiperfs_words(tmp_path, monkeypatch):
    monkeypatch.setenv(aiperf_sweep.AIPERF_ENV, "fake-aiperf")

    def run(cmd, stdout, stderr):
        stdout.write("connection refused\n")
        return subprocess.CompletedProcess(cmd, 1)

    with pytest.raises(RuntimeError, match="(?s)mode heavy, concurrency 1.*connection refused"):
        aiperf_sweep.sweep(config(), tmp_path, lambda m: None, run)


def test_short_answer_prompts_are_chat_renders_with_and_without_context():
    render = lambda messages: "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"  # noqa: E731
    prompts = short_answer_prompts(render, context_tokens=300, nonce="abcd1234")
    short = [p for p in prompts if p.workload == SHORT]
    rag = [p for p in prompts if p.workload == SHORT_RAG]
    assert len(short) == len(QUESTIONS) and len(rag) == len(RAG_QUESTIONS)
    assert len({p.text for p in prompts}) == len(prompts) and len({p.id for p in prompts}) == len(prompts)
    assert all(p.text.startswith("system:[abcd1234] ") and p.text.endswith("|assistant:") for p in prompts)
    assert short[0].text.endswith(f"user:{QUESTIONS[0]}|assistant:")
    assert all("# ---- retrieved:" in p.text and len(p.text) > 1000 for p in rag)
    assert all("# ---- retrieved:" not in p.text for p in short)
    assert not [p for p in short_answer_prompts(render, rag=False) if p.workload == SHORT_RAG]


def test_the_bench_asks_for_a_chat_template_for_the_short_answer_workloads(monkeypatch, tmp_path):
    import argparse

    from tokenrouter_backend.bench import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--workloads", "code,short", "--per-workload", "3"])
    with pytest.raises(SystemExit, match="need --repo"):
        bench.bench_prompts(args, lambda m: None)
    monkeypatch.setattr(bench, "chat_renderer", lambda repo: lambda messages: messages[-1]["content"])
    monkeypatch.setattr("tokenrouter_backend.bench.traffic.repo_tokenizer", lambda repo: None)
    args = p.parse_args(["--workloads", "code,short", "--per-workload", "3", "--repo", str(tmp_path)])
    prompts = bench.bench_prompts(args, lambda m: None)
    assert [p.workload for p in prompts] == ["code"] * 3 + [SHORT] * 3
    assert prompts[3].text == QUESTIONS[0]
    assert SHORT not in p.parse_args([]).workloads  # asked for by name only
