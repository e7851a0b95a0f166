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
    assert lines[3] == "| verify | 1 | 12 | 10.0 | 20.0 | 5.2 | 100.0 | - | 2.5 | 40.0 |"  # no heavy at c=1
    assert lines[2] == "| heavy | 4 | 12 | 20.0 | 40.0 | 5.2 | 100.0 | 1.0 | 2.5 | 40.0 |"


def test_ratio_to_heavy_and_small_rates(tmp_path, capsys):
    for name, tps, rps in (("heavy-c2", 1.25, 0.038), ("route-c2", 2.5, 0.0761)):
        (tmp_path / name).mkdir()
        data = export(10.0)
        data["output_token_throughput"]["avg"], data["request_throughput"]["avg"] = tps, rps
        (tmp_path / name / aiperf_table.EXPORT).write_text(json.dumps(data))
    assert aiperf_table.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3] == "| route | 2 | 12 | 10.0 | 20.0 | 5.2 | 2.5 | 2.0 | 0.0761 | 40.0 |"
    assert lines[2].split(" | ")[7:9] == ["1.0", "0.038"]
