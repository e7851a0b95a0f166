"""Summary of HumanEval records (``client/humaneval.py``): per format and arm, pass@1,
tokens/s (total tokens / total time) and its ratio to heavy, light share, exact match with
heavy's answer. Only problems every arm of the file finished count (a run cut short leaves
the last problem out for all arms)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def complete(records: list[dict]) -> list[dict]:
    """The records of (format, task) pairs that every arm of their format answered."""
    arms = defaultdict(set)
    for r in records:
        arms[r["format"]].add(r["arm"])
    seen = defaultdict(set)
    for r in records:
        seen[(r["format"], r["task_id"])].add(r["arm"])
    return [r for r in records if seen[(r["format"], r["task_id"])] == arms[r["format"]]]


def summary(records: Iterable[dict]) -> list[dict]:
    records = complete(list(records))
    by = defaultdict(list)
    for r in records:
        by[(r["format"], r["arm"])].append(r)
    heavy_text = {(r["format"], r["task_id"]): r["text"] for r in records if r["arm"] == "heavy"}
    rows = []
    for (fmt, arm), rs in sorted(by.items()):
        ok = [r for r in rs if not r["error"]]
        tokens, secs = sum(r["tokens"] for r in ok), sum(r["latency_s"] for r in ok)
        same = [r["text"] == heavy_text[(fmt, r["task_id"])] for r in ok if (fmt, r["task_id"]) in heavy_text]
        rows.append({"format": fmt, "arm": arm, "n": len(rs), "errors": len(rs) - len(ok),
                     "pass_at_1": sum(r["passed"] for r in ok) / len(rs) if rs else 0.0,
                     "tok_s": tokens / secs if secs else 0.0,
                     "light_share": sum(r["light_tokens"] for r in ok) / tokens if tokens else 0.0,
                     "exact_vs_heavy": sum(same) / len(same) if same else None})
    base = {r["format"]: r["tok_s"] for r in rows if r["arm"] == "heavy"}
    for r in rows:
        r["x_heavy"] = r["tok_s"] / base[r["format"]] if base.get(r["format"]) else None
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| format | arm | n | pass@1 | tok/s | × heavy | light share | exact vs heavy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        xh = "–" if r["x_heavy"] is None else f"{r['x_heavy']:.2f}"
        ex = "–" if r["exact_vs_heavy"] is None else f"{r['exact_vs_heavy']:.0%}"
        lines.append(f"| {r['format']} | {r['arm']} | {r['n']} | {r['pass_at_1']:.1%} | {r['tok_s']:.2f} | {xh} | "
                     f"{r['light_share']:.0%} | {ex} |")
    return "\n".join(lines)
