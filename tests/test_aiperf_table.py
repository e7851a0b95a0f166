"""bench/aiperf_table.py: AIPerf's JSON exports -> one table, rows by mode and concurrency."""
from __future__ import annotations

import json

from tokenrouter_backend.bench import aiperf_table


def export(ttft50: float) -> dict:
    stat = lambda **v: {"unit": "ms", **v}  # noqa: E731
    return {"request_count": {"avg": 12}, "time_to_first_token": stat(p50=ttft50, p90=ttft50 * 2, avg=ttft50),
            "inter_token_latency": stat(avg=5.25), "output_token_throughput": {"avg": 100.0},
            "request_throughput": {"avg": 2.5}, "output_sequence_length": {"avg": 40.0}}


def test_table_rows_by_mode_then_concurrency(tmp_path, capsys):
    for name, ttft in (("verify-c8", 30.0), ("verify-c1", 10.0), ("heavy-c4", 20.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / aiperf_table.EXPORT).write_text(json.dumps(export(ttft)))
    (tmp_path / "notes").mkdir()  # not a run: left out
    assert aiperf_table.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| mode | concurrency | requests | TTFT p50 ms")
    assert [line.split(" | ")[:2] for line in lines[2:]] == [["| heavy", "4"], ["| verify", "1"], ["| verify", "8"]]
    assert lines[3] == "| verify | 1 | 12 | 10.0 | 20.0 | 5.2 | 100.0 | - | - | - | - | 2.5 | 40.0 |"  # no heavy at c=1
    assert lines[2] == "| heavy | 4 | 12 | 20.0 | 40.0 | 5.2 | 100.0 | 1.00 | 1.00 | 1.00 | - | 2.5 | 40.0 |"


def test_ratio_to_heavy_and_small_rates(tmp_path, capsys):
    for name, tps, rps in (("heavy-c2", 1.25, 0.038), ("route-c2", 2.5, 0.0761)):
        (tmp_path / name).mkdir()
        data = export(10.0)
        data["output_token_throughput"]["avg"], data["request_throughput"]["avg"] = tps, rps
        (tmp_path / name / aiperf_table.EXPORT).write_text(json.dumps(data))
    assert aiperf_table.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3] == "| route | 2 | 12 | 10.0 | 20.0 | 5.2 | 2.5 | 2.00 | 1.00 | 1.00 | - | 0.0761 | 40.0 |"
    assert lines[2].split(" | ")[7:8] + lines[2].split(" | ")[11:12] == ["1.00", "0.038"]


def test_goodput_and_latency_ratios(tmp_path):
    for name, ttft, itl, good in (("heavy-c4", 20.0, 8.0, 0.5), ("verify-c4", 30.0, 4.0, 0.25)):
        (tmp_path / name).mkdir()
        data = export(ttft)
        data["inter_token_latency"]["avg"], data["goodput"] = itl, {"unit": "requests/sec", "avg": good}
        (tmp_path / name / aiperf_table.EXPORT).write_text(json.dumps(data))
    heavy, verify = aiperf_table.rows(tmp_path)
    assert (verify["ttft_p50_x_heavy"], verify["itl_x_heavy"], verify["goodput"]) == (1.5, 0.5, 0.25)
    assert heavy["goodput"] == 0.5 and heavy["tokens_per_s_x_heavy"] == 1.0
