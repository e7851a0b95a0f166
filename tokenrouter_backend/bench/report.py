"""Bench output: results.json, results.md (markdown tables) and PNG plots.

Plots: ``frontier.png`` (speed vs quality: median paired speedup over ``heavy`` against mean
token agreement and mean heavy NLL, route thresholds joined by a line) and ``load.png``
(throughput and p99 latency vs concurrency per mode, from the perf_analyzer sweep).
"""
from __future__ import annotations

import json
from pathlib import Path

FRONTIER_PNG = "frontier.png"
LOAD_PNG = "load.png"
SPEED_BASELINE = "heavy"


def _f(v, fmt="{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def _iqr(s: dict | None, fmt="{:.2f}") -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{fmt.format(s['median'])} [{fmt.format(s['q25'])}–{fmt.format(s['q75'])}]"


COLUMNS = ("arm", "n", "tok/s", "× heavy [IQR]", "× hf_heavy", "× hf_assisted", "e2e s", "TTFT s",
           "light share", "heavy calls/tok", "mean acc.", "overhead", "exact", "tok agree", "seq agree",
           "NLL", "pass@1")


def _row(arm: str, s: dict) -> list[str]:
    sp = s.get("speedup", {})
    he = s.get("humaneval_pass_at_1")
    return [arm, f"{s['runs'] - s['errors']}/{s['runs']}", _f(s["tokens_per_s"]["median"]),
            _iqr(sp.get("heavy")), _iqr(sp.get("hf_heavy")), _iqr(sp.get("hf_assisted")),
            _f(s["latency_s"]["median"]), _f(s["ttft_s"]["median"]),
            _f(s["light_share"], "{:.0%}"), _f(s["heavy_calls_per_token"], "{:.3f}"),
            _f(s["mean_accepted"]), _f(s["router_overhead_share"]["median"], "{:.1%}"),
            _f(s["exact_match"], "{:.0%}"), _f(s["token_agreement"], "{:.0%}"),
            _f(s["seq_agreement"], "{:.0%}"), _f(s["nll"], "{:.3f}"),
            "–" if he is None else f"{he:.0%} ({s['humaneval_n']})"]


def aiperf_section(results: dict) -> list[str]:
    """The AIPerf chat sweep's table (``aiperf_sweep``), if the run had one."""
    if not results.get("aiperf"):
        return []
    from .aiperf_table import markdown as aiperf_markdown

    return ["## AIPerf chat sweep (OpenAI front, streaming; ratios to heavy-only at the same concurrency)", "",
            aiperf_markdown(results["aiperf"]), ""]


def markdown(results: dict) -> str:
    cfg = results["config"]
    if "summary" not in results:  # --aiperf-only
        return "\n".join(["# TokenRouter bench — AIPerf chat sweep", "", *aiperf_section(results)]) + "\n"
    lines = [f"# TokenRouter bench — {len(cfg['prompts'])} prompts, max_tokens {cfg['max_tokens']}, "
             f"repeats {cfg['repeats']}", "",
             f"Machine: {results['machine'].get('cpu', '?')}, {results['machine'].get('cpus')} CPUs. "
             f"Wall time of the interleaved runs: {results['wall_s']} s.", "",
             "Ratios: per-prompt paired (same prompt, arm ÷ baseline tokens/s), median [IQR]. "
             "Quality vs heavy-only greedy output of the same prompt.", ""]
    for workload, arms in results["summary"].items():
        lines += [f"## {workload}", "", "| " + " | ".join(COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_row(arm, s)) + " |" for arm, s in arms.items()]
        lines.append("")
    if results.get("load"):
        lines += ["## Load (perf_analyzer, gRPC streaming)", "",
                  "| mode | concurrency | req/s | tok/s (≤, req/s × max_tokens) | p50 ms | p99 ms |",
                  "|---|---|---|---|---|---|"]
        for p in results["load"]:
            if "error" in p:
                lines.append(f"| {p['mode']} | {p['concurrency']} | error: {p['error'][-80:]!r} | | | |")
            else:
                lines.append(f"| {p['mode']} | {p['concurrency']} | {p['throughput_rps']:.3f} | "
                             f"{p['tokens_per_s']:.2f} | {p['p50_latency_ms']:.0f} | {p['p99_latency_ms']:.0f} |")
        lines.append("")
    lines += aiperf_section(results)
    errors = [r for r in results["records"] if r["error"]]
    if errors:
        lines += ["## Errors", ""] + [f"- {r['arm']} {r['prompt_id']}: {r['error'][:200]}" for r in errors[:20]]
    return "\n".join(lines) + "\n"


def plot_frontier(results: dict, path: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = results.get("summary", {}).get("all", {})
    pts = {a: s for a, s in summary.items() if s.get("speedup", {}).get(SPEED_BASELINE) and a != SPEED_BASELINE}
    if not pts:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "token_agreement", "token agreement with heavy-only"),
                           (axes[1], "nll", "heavy-model NLL (nats/token, lower is better)")):
        for prefix, series in (("route@", "route (confidence threshold)"), ("router@", "learned router (bar)")):
            swept = sorted((a for a in pts if a.startswith(prefix)), key=lambda a: float(a.split("@")[1]))
            xs = [pts[a]["speedup"][SPEED_BASELINE]["median"] for a in swept]
            ys = [pts[a][key] for a in swept]
            if swept and all(y is not None for y in ys):
                ax.plot(xs, ys, "o-", label=series)
                for a, x, y in zip(swept, xs, ys):
                    ax.annotate(a.split("@")[1], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        for a in pts:
            if "@" not in a and pts[a][key] is not None:
                ax.plot(pts[a]["speedup"][SPEED_BASELINE]["median"], pts[a][key], "s", label=a)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("median paired speedup vs heavy (tokens/s)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("Speed vs quality (all prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_load(results: dict, path: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in results.get("load", []) if "error" not in p]
    if not pts:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for mode in dict.fromkeys(p["mode"] for p in pts):
        ps = sorted((p for p in pts if p["mode"] == mode), key=lambda p: p["concurrency"])
        cs = [p["concurrency"] for p in ps]
        axes[0].plot(cs, [p["throughput_rps"] for p in ps], "o-", label=mode)
        axes[1].plot(cs, [p["p99_latency_ms"] / 1000 for p in ps], "o-", label=mode)
    axes[0].set_ylabel("throughput (requests/s)")
    axes[1].set_ylabel("p99 latency (s)")
    for ax in axes:
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle("perf_analyzer sweep (gRPC streaming)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_all(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = [name for name, fn in ((FRONTIER_PNG, plot_frontier), (LOAD_PNG, plot_load))
                        if fn(results, out / name)]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "results.md").write_text(markdown(results))


def _tokenizer(src: str | None):
    """The HF tokenizer of an HF folder or GGUF source; None without one."""
    if not src:
        return None
    from transformers import AutoTokenizer

    from .peers import gguf_location

    folder, gguf = gguf_location(Path(src).expanduser())
    return AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))


def from_records(out: Path, tokenizer_src: str | None) -> dict:
    """Results of a cut-short run from its records.jsonl (no NLL: that needs the heavy model)."""
    from .records import RECORDS_JSONL, build_results, read_records
    from .workloads import ALL_WORKLOADS, load_workloads

    records = read_records(out / RECORDS_JSONL)
    prompts = {p.id: p for p in load_workloads(ALL_WORKLOADS, full=True)}
    config = {"max_tokens": None, "repeats": 1 + max(r.repeat for r in records),
              "prompts": list(dict.fromkeys(r.prompt_id for r in records)),
              "arms": list(dict.fromkeys(r.arm for r in records)), "partial": True, "nll_scorer": None}
    return build_results(config, records, prompts, _tokenizer(tokenizer_src), None,
                         sum(r.latency_s for r in records))


def main(argv: list[str] | None = None) -> int:
    """``python -m tokenrouter_backend.bench.report OUT [--load LOAD.json]``: re-render OUT from its results.json,
    optionally adding a separate perf_analyzer sweep (``python -m tokenrouter_backend.bench.load``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tokenrouter_backend.bench.report", description=main.__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--load", type=Path, default=None)
    p.add_argument("--from-records", action="store_true",
                   help="rebuild from OUT/records.jsonl (a run cut short): ratios, summary, HumanEval")
    p.add_argument("--tokenizer", default=None, help="with --from-records: HF folder/GGUF for token agreement")
    a = p.parse_args(argv)
    results = (from_records(a.out, a.tokenizer) if a.from_records
               else json.loads((a.out / "results.json").read_text()))
    if a.load:
        results["load"] = json.loads(a.load.read_text())
    write_all(results, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
