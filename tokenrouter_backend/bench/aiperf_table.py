"""One markdown table from AIPerf runs (``OUT/<mode>-c<concurrency>/profile_export_aiperf.json``):
TTFT, inter-token latency, output tokens/s (and its ratio to heavy-only at the same
concurrency) and requests/s per mode and concurrency."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RUN_DIR = re.compile(r"^(?P<mode>[a-z]+)-c(?P<concurrency>\d+)$")
EXPORT = "profile_export_aiperf.json"
HEADER = ("mode", "concurrency", "requests", "TTFT p50 ms", "TTFT p90 ms", "ITL avg ms", "output tok/s",
          "tok/s x heavy", "requests/s", "output tokens avg")
TOKENS_PER_S = 6  # column of output tok/s in a row


def row(mode: str, concurrency: int, data: dict) -> tuple:
    ttft, itl = data["time_to_first_token"], data["inter_token_latency"]
    return (mode, concurrency, int(data["request_count"]["avg"]), ttft["p50"], ttft["p90"], itl["avg"],
            data["output_token_throughput"]["avg"], data["request_throughput"]["avg"],
            data["output_sequence_length"]["avg"])


def table(out: Path) -> str:
    rows = []
    for run in sorted(Path(out).iterdir()):
        m = RUN_DIR.match(run.name)
        if m and (run / EXPORT).is_file():
            rows.append(row(m["mode"], int(m["concurrency"]), json.loads((run / EXPORT).read_text())))
    rows.sort(key=lambda r: (r[0], r[1]))
    heavy = {r[1]: r[TOKENS_PER_S] for r in rows if r[0] == "heavy"}
    rows = [r[:TOKENS_PER_S + 1] + (r[TOKENS_PER_S] / heavy[r[1]] if heavy.get(r[1]) else "-",) + r[TOKENS_PER_S + 1:]
            for r in rows]
    cells = [" | ".join(_cell(v) for v in r) for r in rows]
    return "\n".join([f"| {' | '.join(HEADER)} |", "|" + "---|" * len(HEADER), *(f"| {c} |" for c in cells)])


def _cell(value) -> str:
    """Floats with one decimal, small ones (a CPU's requests/s) with three significant digits."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tokenrouter_backend.bench.aiperf_table OUT_DIR", file=sys.stderr)
        return 2
    print(table(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
