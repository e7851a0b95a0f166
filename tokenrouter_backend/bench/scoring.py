"""Benchmark arithmetic: quality per run, paired ratios, per-arm summaries (median, IQR).

Pairing: a ratio is computed only between two runs of the SAME prompt and repeat (arm vs
baseline), never between medians of unpaired runs.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from .quality import NllScorer, compare_tokens, humaneval_passed

BASELINES = ("heavy", "hf_heavy", "hf_assisted")   # speed ratios are taken against each present
REFERENCES = ("heavy", "hf_heavy")                  # heavy-only greedy output: quality reference
ALL = "all"


def load_scoring(peers, repo: Path | None, want_nll: bool = True):
    """(tokenizer, NllScorer | None): transformers heavy if loaded, else the repository's."""
    if peers is not None:
        return peers.tokenizer, (NllScorer.from_hf(peers.heavy) if want_nll else None)
    if repo is None:
        return None, None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(repo) / "preprocessing" / "1" / "tokenizer")
    heavy = Path(repo) / "heavy" / "1"
    scorer = NllScorer.from_onnx(heavy) if want_nll and (heavy / "model.onnx").exists() else None
    return tokenizer, scorer


def _reference(group: dict[str, object]):
    for name in REFERENCES:
        rec = group.get(name)
        if rec is not None and not rec.error:
            return rec
    return None


def add_quality(records: list, prompts: dict, tokenizer, scorer: NllScorer | None) -> None:
    """Fill the quality fields of every record in place."""
    groups: dict[tuple, dict] = {}
    for r in records:
        groups.setdefault((r.prompt_id, r.repeat), {})[r.arm] = r
    for (prompt_id, _), group in groups.items():
        prompt = prompts[prompt_id]
        ref = _reference(group)
        enc = (lambda s: tokenizer(s, add_special_tokens=False).input_ids) if tokenizer else None
        ref_ids = enc(ref.text) if (ref and enc) else None
        prompt_ids = enc(prompt.text) if enc else None
        for r in group.values():
            if r.error:
                continue
            ids = enc(r.text) if enc else None
            if ref_ids is not None:
                cmp = compare_tokens(ids, ref_ids)
                r.exact_match, r.token_agreement = cmp.exact_match, round(cmp.token_agreement, 4)
                r.common_prefix_tokens, r.seq_agreement = cmp.common_prefix_tokens, round(cmp.seq_agreement, 4)
            if scorer is not None and ids:
                nll = scorer.score(prompt_ids, ids)
                r.nll = round(nll, 4) if nll is not None else None
            if prompt.problem is not None:
                r.humaneval_passed = humaneval_passed(prompt.problem, r.text)


def paired_ratios(records: list) -> list[dict]:
    """Per (arm, baseline, prompt, repeat): speedup (tokens/s ratio) and latency ratio."""
    by_key: dict[tuple, dict] = {}
    for r in records:
        if not r.error:
            by_key.setdefault((r.prompt_id, r.repeat), {})[r.arm] = r
    out = []
    for (prompt_id, rep), group in by_key.items():
        for base_name in BASELINES:
            base = group.get(base_name)
            if base is None or base.tokens_per_s <= 0:
                continue
            for arm, r in group.items():
                if arm == base_name:
                    continue
                out.append({"arm": arm, "baseline": base_name, "prompt_id": prompt_id, "workload": r.workload,
                            "repeat": rep, "speedup": r.tokens_per_s / base.tokens_per_s,
                            "latency_ratio": r.latency_s / base.latency_s if base.latency_s else None})
    return out


def spread(values: list[float]) -> dict:
    """median, 25th/75th percentiles (IQR), min, max, n."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"n": 0, "median": None, "q25": None, "q75": None, "min": None, "max": None}
    q = statistics.quantiles(vals, n=4, method="inclusive") if len(vals) > 1 else [vals[0]] * 3
    return {"n": len(vals), "median": round(statistics.median(vals), 4), "q25": round(q[0], 4),
            "q75": round(q[2], 4), "min": round(vals[0], 4), "max": round(vals[-1], 4)}


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def _arm_summary(recs: list, ratios: list[dict]) -> dict:
    ok = [r for r in recs if not r.error]
    he = [r.humaneval_passed for r in ok if r.humaneval_passed is not None]
    return {
        "runs": len(recs), "errors": len(recs) - len(ok),
        "tokens": _mean(r.tokens for r in ok),
        "tokens_per_s": spread([r.tokens_per_s for r in ok]),
        "latency_s": spread([r.latency_s for r in ok]),
        "ttft_s": spread([r.ttft_s for r in ok]),
        "light_share": _mean(r.light_share for r in ok),
        "heavy_calls_per_token": _mean(r.heavy_calls_per_token for r in ok),
        "mean_accepted": _mean(r.mean_accepted for r in ok),
        "router_overhead_share": spread([r.router_overhead_share for r in ok]),
        "exact_match": _mean(r.exact_match for r in ok),
        "token_agreement": _mean(r.token_agreement for r in ok),
        "seq_agreement": _mean(r.seq_agreement for r in ok),
        "nll": _mean(r.nll for r in ok),
        "humaneval_pass_at_1": round(sum(he) / len(he), 4) if he else None,
        "humaneval_n": len(he),
        "speedup": {b: spread([x["speedup"] for x in ratios if x["baseline"] == b]) for b in BASELINES
                    if any(x["baseline"] == b for x in ratios)},
        "latency_ratio": {b: spread([x["latency_ratio"] for x in ratios if x["baseline"] == b])
                          for b in BASELINES if any(x["baseline"] == b for x in ratios)},
    }


def summarize(records: list, ratios: list[dict]) -> dict:
    """{workload or "all": {arm: summary}} in arm order of first appearance."""
    arms = list(dict.fromkeys(r.arm for r in records))
    workloads = [ALL] + list(dict.fromkeys(r.workload for r in records))
    out: dict = {}
    for w in workloads:
        out[w] = {}
        for arm in arms:
            recs = [r for r in records if r.arm == arm and (w == ALL or r.workload == w)]
            rat = [x for x in ratios if x["arm"] == arm and (w == ALL or x["workload"] == w)]
            if recs:
                out[w][arm] = _arm_summary(recs, rat)
    return out
