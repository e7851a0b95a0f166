"""`tokenrouter bench` end to end on the tiny pair through a real tritonserver, and
perf_analyzer driven with the generated input data against that server.

The tiny pair and its exported repository come from the shared, cached ``tiny_repository``
fixture (tests/conftest.py).
"""
from __future__ import annotations

import json
from dataclasses import fields

import pytest

from tokenrouter_backend.bench import bench, load
from tokenrouter_backend.bench.records import RunRecord
from tokenrouter_backend.bench.workloads import load_workloads
from tokenrouter_backend.export.tiny_pair import build_tiny_pair
from tokenrouter_backend.server import paths

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

THRESHOLD = 0.8
EXPECTED_ARMS = {"heavy", "light", "verify", f"route@{THRESHOLD:g}", "hf_heavy", "hf_assisted", "hf_prompt_lookup"}


@pytest.fixture(scope="module")
def tiny(tiny_repository):
    """(heavy HF dir, light HF dir, exported repository): the shared, cached tiny pair."""
    heavy, light = build_tiny_pair(paths.tiny_dir())   # stamp-checked: no rebuild
    return heavy, light, tiny_repository


@pytest.fixture(scope="module")
def server(tiny, start_triton_module):
    return start_triton_module(tiny[2])


@pytest.fixture(scope="module")
def quick_results(tiny, server, tmp_path_factory):
    heavy, light, repo = tiny
    out = tmp_path_factory.mktemp("bench")
    rc = bench.main(["--url", server.grpc_url, "--repo", str(repo), "--heavy", str(heavy), "--light", str(light),
                     "--workloads", "code,humaneval", "--per-workload", "2", "--max-tokens", "12",
                     "--thresholds", str(THRESHOLD), "--out", str(out)])
    assert rc == 0
    return json.loads((out / "results.json").read_text()), out


def test_every_arm_runs_and_every_field_is_there(quick_results):
    results, out = quick_results
    records = results["records"]
    assert {r["arm"] for r in records} == EXPECTED_ARMS
    assert [r for r in records if r["error"]] == []
    names = {f.name for f in fields(RunRecord)}
    for r in records:
        assert set(r) == names
        assert r["tokens"] > 0 and r["latency_s"] > 0 and 0 < r["ttft_s"] <= r["latency_s"]
        assert r["nll"] is not None and r["token_agreement"] is not None
        if r["workload"] == "humaneval":
            assert r["humaneval_passed"] in (True, False)
    for r in records:
        if r["arm"] in ("heavy", "light", "verify") or r["arm"].startswith("route@"):
            assert r["light_share"] is not None and r["heavy_calls_per_token"] is not None
            assert r["router_overhead_share"] is not None and "generated_tokens" in r["stats"]
    assert (out / "results.md").read_text().count("| verify |") == 3   # all, code, humaneval
    assert "frontier.png" in results["plots"] and (out / "frontier.png").stat().st_size > 0


def test_ratios_come_from_paired_runs(quick_results):
    results, _ = quick_results
    tps = {(r["arm"], r["prompt_id"], r["repeat"]): r["tokens_per_s"] for r in results["records"]}
    heavy_ratios = [x for x in results["ratios"] if x["baseline"] == "heavy"]
    assert {x["arm"] for x in heavy_ratios} == EXPECTED_ARMS - {"heavy"}
    for x in heavy_ratios:
        expected = tps[(x["arm"], x["prompt_id"], x["repeat"])] / tps[("heavy", x["prompt_id"], x["repeat"])]
        assert x["speedup"] == pytest.approx(expected, rel=1e-3)
    verify = results["summary"]["all"]["verify"]["speedup"]["heavy"]
    assert verify["n"] == 4 and verify["q25"] <= verify["median"] <= verify["q75"]


def test_verify_matches_heavy_and_heavy_is_its_own_reference(quick_results):
    results, _ = quick_results
    for r in results["records"]:
        if r["arm"] == "heavy":
            assert r["exact_match"] and r["token_agreement"] == 1.0
        if r["arm"] == "verify":          # lossless speculative decoding: token-identical
            assert r["exact_match"], r["prompt_id"]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_perf_analyzer_accepts_generated_input_data(server, tmp_path, concurrency):
    prompts = load_workloads(["code", "structured"], quick=True)
    point = load.run_point(server.grpc_url, prompts, "verify", concurrency, 4, tmp_path, window_requests=4,
                           timeout_s=120, admin_key=server.restriction.key)
    assert point.throughput_rps > 0 and point.p99_latency_ms > 0
    assert point.csv_row["Concurrency"] == str(concurrency)
