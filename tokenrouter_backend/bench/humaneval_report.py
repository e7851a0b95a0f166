"""Summary of HumanEval records (``bench/humaneval.py``): per format and arm, pass@1,
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


def plot_frontier(rows: list[dict], path: Path) -> bool:
    """PNG per format: pass@1 and exact match with heavy against tokens/s x heavy, one point
    per arm (swept arms ``name@T`` joined by a line). False when there is no heavy arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = sorted({r["format"] for r in rows if r["x_heavy"] is not None})
    if not formats:
        return False
    fig, axes = plt.subplots(len(formats), 2, figsize=(11, 4.2 * len(formats)), squeeze=False)
    for row_axes, fmt in zip(axes, formats):
        pts = [r for r in rows if r["format"] == fmt]
        for ax, key, label in ((row_axes[0], "pass_at_1", "pass@1"),
                               (row_axes[1], "exact_vs_heavy", "answers identical to heavy's")):
            for prefix in sorted({r["arm"].split("@")[0] for r in pts if "@" in r["arm"]}):
                swept = sorted((r for r in pts if r["arm"].startswith(prefix + "@")),
                               key=lambda r: float(r["arm"].split("@")[1]))
                ax.plot([r["x_heavy"] for r in swept], [r[key] for r in swept], "o-", label=f"{prefix}@T")
                for r in swept:
                    ax.annotate(r["arm"].split("@")[1], (r["x_heavy"], r[key]), textcoords="offset points",
                                xytext=(4, 4), fontsize=8)
            for r in pts:
                if "@" not in r["arm"] and r[key] is not None:
                    ax.plot(r["x_heavy"], r[key], "s", label=r["arm"])
            ax.axvline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xlabel("tokens/s x heavy (total tokens / total time)")
            ax.set_ylabel(label)
            ax.set_title(f"HumanEval {fmt}, {pts[0]['n']} problems", fontsize=9)
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown(rows: list[dict]) -> str:
    lines = ["| format | arm | n | pass@1 | tok/s | × heavy | light share | exact vs heavy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        xh = "–" if r["x_heavy"] is None else f"{r['x_heavy']:.2f}"
        ex = "–" if r["exact_vs_heavy"] is None else f"{r['exact_vs_heavy']:.0%}"
        lines.append(f"| {r['format']} | {r['arm']} | {r['n']} | {r['pass_at_1']:.1%} | {r['tok_s']:.2f} | {xh} | "
                     f"{r['light_share']:.0%} | {ex} |")
    return "\n".join(lines)
