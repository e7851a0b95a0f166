"""One markdown table from AIPerf runs (``OUT/<mode>-c<concurrency>/profile_export_aiperf.json``):
TTFT, inter-token latency, output tokens/s, goodput (requests/s within the SLO, when the run
had one) and requests/s per mode and concurrency, with output tokens/s, TTFT p50 and ITL as
ratios to heavy-only at the same concurrency."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RUN_DIR = re.compile(r"^(?P<mode>[a-z]+)-c(?P<concurrency>\d+)$")
EXPORT = "profile_export_aiperf.json"
COLUMNS = (("mode", "mode"), ("concurrency", "concurrency"), ("requests", "requests"),
           ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p90 ms", "ttft_p90_ms"), ("ITL avg ms", "itl_ms"),
           ("output tok/s", "tokens_per_s"), ("tok/s x heavy", "tokens_per_s_x_heavy"),
           ("TTFT p50 x heavy", "ttft_p50_x_heavy"), ("ITL x heavy", "itl_x_heavy"),
           ("goodput req/s", "goodput"), ("requests/s", "requests_per_s"), ("output tokens avg", "output_tokens"))
RATIOS = (("tokens_per_s_x_heavy", "tokens_per_s"), ("ttft_p50_x_heavy", "ttft_p50_ms"), ("itl_x_heavy", "itl_ms"))


def row(mode: str, concurrency: int, data: dict) -> dict:
    ttft, itl = data["time_to_first_token"], data["inter_token_latency"]
    good = data.get("goodput")
    return {"mode": mode, "concurrency": concurrency, "requests": int(data["request_count"]["avg"]),
            "ttft_p50_ms": ttft["p50"], "ttft_p90_ms": ttft["p90"], "itl_ms": itl["avg"],
            "tokens_per_s": data["output_token_throughput"]["avg"], "goodput": good["avg"] if good else None,
            "requests_per_s": data["request_throughput"]["avg"],
            "output_tokens": data["output_sequence_length"]["avg"]}


def rows(out: Path) -> list[dict]:
    """One row per run folder under ``out``, by mode then concurrency, with the ratios to heavy."""
    found = []
    for run in sorted(Path(out).iterdir()):
        m = RUN_DIR.match(run.name)
        if m and (run / EXPORT).is_file():
            found.append(row(m["mode"], int(m["concurrency"]), json.loads((run / EXPORT).read_text())))
    found.sort(key=lambda r: (r["mode"], r["concurrency"]))
    heavy = {r["concurrency"]: r for r in found if r["mode"] == "heavy"}
    for r in found:
        base = heavy.get(r["concurrency"])
        for ratio, field in RATIOS:
            r[ratio] = r[field] / base[field] if base and base[field] else None
    return found


def markdown(table_rows: list[dict]) -> str:
    header = [name for name, _ in COLUMNS]
    cells = [" | ".join(_ratio(r[key]) if key.endswith("_x_heavy") else _cell(r[key]) for _, key in COLUMNS)
             for r in table_rows]
    return "\n".join([f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {c} |" for c in cells)])


def table(out: Path) -> str:
    return markdown(rows(out))


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cell(value) -> str:
    """Floats with one decimal, small ones (a CPU's requests/s) with three significant
    digits; '-' where there is no value (no heavy-only run at that concurrency, no SLO)."""
    if value is None:
        return "-"
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
