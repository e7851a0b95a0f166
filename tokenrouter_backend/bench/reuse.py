"""Reuse workloads side by side: a shared long context (prefix cache) and copy-heavy edits
(n-gram drafts).

``python -m tokenrouter_backend.bench.reuse --url HOST:PORT --repo REPO`` runs against a
running server (streamed gRPC, greedy):

* ``reuse``: per round a new ~N-token context of retrieved standard-library source, then
  ``--questions`` requests that each ask their own question about it. The round's first
  request is cold (nothing of that context is cached: exactly what it costs without the
  prefix cache); the later ones find the context's KV cached. Per mode: time to first token
  and total of cold and warm requests, and the warm/cold ratios. Modes take turns per round,
  each on its own context.
* ``copy``: the chat-formatted instruction "rewrite this function without comments and
  docstrings" with a standard-library function in the prompt; arms heavy, verify with
  n-gram drafts, verify without (``ngram_drafts`` per request), interleaved per prompt, order
  rotated; tokens/s ratios to heavy-only and whether each output equals heavy-only's. One
  request per prompt first puts its KV in both branches' prefix caches, so every arm starts
  from a cached prompt (the arms compare generation, not prefill).

* ``window``: long RAG-like prompts in verify mode (fixed block schedule, so the light model
  is always used), the light branch with its whole KV and with ``light_kv_window`` (arms
  alternate first; the heavy prompt KV cached for both): time to first token, total, light
  acceptance, light compute, the light branch's KV peak (``--metrics-url``), identical output.
* ``repeat``: each code prompt twice in verify mode, the second with the decision cache
  (the first's answer as drafts): time ratio, hit count, identical outputs.

Every request but the ``repeat`` ones sends ``answer_cache: false`` (arms share prompts).
Output: tables on stdout and ``OUT/reuse.json``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import secrets
import statistics
import sys
import textwrap
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenrouter_backend.client import triton_client

from .traffic import QUESTION, rag_prompt

QUESTIONS = (
    "\n\n# Question: write a function `first_name()` that returns the name of the first function defined above.\n",
    "\n\n# Question: which module above is the longest? Answer with a comment.\n#",
    "\n\n# Question: write a one-line docstring for the second module above.\n\"\"\"",
    "\n\n# Question: list three functions defined above, one per line.\n# 1.",
)
COPY_SOURCES = (textwrap.dedent, textwrap.indent, json.dumps, statistics.median, inspect.cleandoc,
                statistics.mode)
COPY_INSTRUCTION = "Rewrite this Python function without its comments and docstring; keep the code unchanged.\n\n"


@dataclass
class Sample:
    workload: str
    arm: str  # mode, or mode+ngram on/off for copy
    round: int
    kind: str  # cold | warm (reuse), copy
    ttft_s: float
    total_s: float
    tokens: int
    tokens_per_s: float
    heavy_reused: int
    light_reused: int
    ngram_accepted: int
    ngram_proposed: int
    text: str
    stats: dict  # the request's routing_stats


def sample(url: str, workload: str, arm: str, rnd: int, kind: str, prompt: str, max_tokens: int, **knobs) -> Sample:
    knobs.setdefault("answer_cache", False)  # arms share prompts: none may draft another's answer
    r = triton_client.generate_grpc(url, prompt, stream=True, max_tokens=max_tokens, **knobs)
    s = r.stats
    return Sample(workload, arm, rnd, kind, r.ttft_s, r.latency_s, r.tokens, r.tokens_per_s,
                  int(s.get("heavy_reused_tokens", 0)), int(s.get("light_reused_tokens", 0)),
                  int(s.get("ngram_drafts_accepted", 0)), int(s.get("ngram_drafts_proposed", 0)), r.text, s)


def reuse_runs(url: str, modes: list[str], rounds: int, context_tokens: int, questions: int,
               max_tokens: int) -> list[Sample]:
    out = []
    for rnd in range(rounds):
        for i, mode in enumerate(modes[rnd % len(modes):] + modes[:rnd % len(modes)]):
            # a tag no earlier request carried: the round's first request is cold even on a
            # server that served these documents before
            tag = f"# request set {secrets.token_hex(4)}\n"
            context = tag + rag_prompt(context_tokens, offset=7 * (rnd * len(modes) + i))[: -len(QUESTION)]
            for q in range(questions):
                kind = "cold" if q == 0 else "warm"
                out.append(sample(url, "reuse", mode, rnd, kind, context + QUESTIONS[q % len(QUESTIONS)],
                                  max_tokens, router_mode=mode))
                s = out[-1]
                print(f"reuse {mode} round {rnd} {kind}: TTFT {s.ttft_s:.1f} s, total {s.total_s:.1f} s, "
                      f"reused heavy {s.heavy_reused} light {s.light_reused}", flush=True)
    return out


def copy_prompt(chat, func) -> str:
    code = inspect.getsource(func)
    return chat.apply_chat_template([{"role": "user", "content": COPY_INSTRUCTION + "```python\n" + code + "```"}],
                                    tokenize=False, add_generation_prompt=True)


COPY_ARMS = (("heavy", {"router_mode": "heavy"}),
             ("verify+ngram", {"router_mode": "verify", "ngram_drafts": True}),
             ("verify", {"router_mode": "verify", "ngram_drafts": False}))


def copy_runs(url: str, repo: Path, prompts: int, max_tokens: int) -> list[Sample]:
    from transformers import AutoTokenizer

    chat = AutoTokenizer.from_pretrained(str(repo / "preprocessing" / "1" / "tokenizer"))
    out = []
    for rnd, func in enumerate(COPY_SOURCES[:prompts]):
        prompt = copy_prompt(chat, func)
        # the prompt's KV cached in both branches first, so no arm pays (or saves) its prefill
        triton_client.generate_grpc(url, prompt, stream=True, max_tokens=2, router_mode="verify", ngram_drafts=False,
                                    answer_cache=False)
        arms = COPY_ARMS[rnd % len(COPY_ARMS):] + COPY_ARMS[:rnd % len(COPY_ARMS)]
        for arm, knobs in arms:
            out.append(sample(url, "copy", arm, rnd, "copy", prompt, max_tokens, **knobs))
            s = out[-1]
            print(f"copy {func.__name__} {arm}: {s.tokens} tokens in {s.total_s:.1f} s = {s.tokens_per_s:.2f} tok/s, "
                  f"n-gram {s.ngram_accepted}/{s.ngram_proposed}", flush=True)
    return out


class LightKVSampler:
    """Peak of the light branch's live KV bytes (``tokenrouter_kv_bytes``) while it runs."""

    def __init__(self, metrics_url: str | None):
        self.url, self.peak, self._stop = metrics_url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> float:
        import urllib.request

        body = urllib.request.urlopen(self.url, timeout=5).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                   if line.startswith("tokenrouter_kv_bytes{") and 'branch="light"' in line)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self._read())

    def __enter__(self):
        if self.url:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.url:
            self._thread.join()


def window_runs(url: str, metrics_url: str | None, lengths: list[int], window: int, max_tokens: int,
                schedule: str = "fixed") -> list[Sample]:
    """Long RAG-like prompts in verify mode, the light branch with its whole KV and with a
    ``window``; the light KV peak sampled from the metrics."""
    out = []
    for rnd, length in enumerate(lengths):
        prompt = rag_prompt(length, offset=3 + rnd)
        # heavy's prompt KV cached first, so both arms skip the same heavy prefill; the light
        # prefill is what the arms compare (a windowed session takes nothing from the cache)
        triton_client.generate_grpc(url, prompt, stream=True, max_tokens=1, router_mode="heavy", answer_cache=False)
        arms = (("full", 0), (f"window{window}", window))
        for arm, w in arms[rnd % 2:] + arms[:rnd % 2]:
            with LightKVSampler(metrics_url) as kv:  # fixed schedule: the cost model cannot skip the light model
                out.append(sample(url, "window", arm, rnd, str(length), prompt, max_tokens, router_mode="verify",
                                  light_kv_window=w, ngram_drafts=False, block_schedule=schedule))
            out[-1].stats["light_kv_peak_bytes"] = kv.peak
            s = out[-1]
            print(f"window {length} {arm}: TTFT {s.ttft_s:.1f} s, total {s.total_s:.1f} s, accepted "
                  f"{s.stats.get('drafts_accepted')}/{s.stats.get('drafts_proposed')}, light KV peak "
                  f"{kv.peak / 2**20:.1f} MiB", flush=True)
    return out


def window_table(samples: list[Sample]) -> list[dict]:
    rows = []
    for arm in dict.fromkeys(s.arm for s in samples if s.workload == "window"):
        mine = [s for s in samples if s.workload == "window" and s.arm == arm]
        full = {s.round: s for s in samples if s.workload == "window" and s.arm == "full"}
        rows.append({"arm": arm, "ttft_s": statistics.mean(s.ttft_s for s in mine),
                     "total_s": statistics.mean(s.total_s for s in mine),
                     "total_vs_full": statistics.mean(full[s.round].total_s / s.total_s for s in mine),
                     "acceptance": sum(s.stats.get("drafts_accepted", 0) for s in mine)
                     / max(1, sum(s.stats.get("drafts_proposed", 0) for s in mine)),
                     "light_forward_ms": statistics.mean(s.stats.get("light_forward_ms", 0) for s in mine),
                     "light_kv_peak_mib": max(s.stats["light_kv_peak_bytes"] for s in mine) / 2**20,
                     "identical_to_full": sum(s.text == full[s.round].text for s in mine)})
    return rows


def repeat_runs(url: str, prompts: int, max_tokens: int) -> list[Sample]:
    """Each code prompt twice in verify mode: the second may draft the first's answer."""
    from .workloads import CODE_PROMPTS

    out = []
    for rnd, text in enumerate(list(CODE_PROMPTS.values())[:prompts]):
        for kind in ("first", "repeat"):
            out.append(sample(url, "repeat", "verify", rnd, kind, text, max_tokens, router_mode="verify",
                              answer_cache=True))
            s = out[-1]
            print(f"repeat {rnd} {kind}: {s.tokens} tokens in {s.total_s:.1f} s, answer drafts "
                  f"{s.stats.get('answer_drafts_accepted', 0)}/{s.stats.get('answer_drafts_proposed', 0)}", flush=True)
    return out


def repeat_table(samples: list[Sample]) -> list[dict]:
    rep = [s for s in samples if s.workload == "repeat"]
    first = {s.round: s for s in rep if s.kind == "first"}
    again = [s for s in rep if s.kind == "repeat"]
    if not again:
        return []
    return [{"workload": "repeat", "prompts": len(again),
             "hit": sum(bool(s.stats.get("answer_cache_hit")) for s in again),
             "speedup_vs_first": statistics.mean(first[s.round].total_s / s.total_s for s in again),
             "identical": sum(s.text == first[s.round].text for s in again)}]


def reuse_table(samples: list[Sample]) -> list[dict]:
    rows = []
    for mode in dict.fromkeys(s.arm for s in samples if s.workload == "reuse"):
        mine = [s for s in samples if s.workload == "reuse" and s.arm == mode]
        cold = [s for s in mine if s.kind == "cold"]
        warm = [s for s in mine if s.kind == "warm"]
        ratios = [statistics.mean(w.ttft_s for w in warm if w.round == c.round) / c.ttft_s for c in cold]
        rows.append({"mode": mode, "cold_ttft_s": statistics.mean(s.ttft_s for s in cold),
                     "warm_ttft_s": statistics.mean(s.ttft_s for s in warm),
                     "warm_over_cold_ttft": statistics.mean(ratios),
                     "cold_total_s": statistics.mean(s.total_s for s in cold),
                     "warm_total_s": statistics.mean(s.total_s for s in warm),
                     "warm_heavy_reused": statistics.mean(s.heavy_reused for s in warm)})
    return rows


def copy_table(samples: list[Sample]) -> list[dict]:
    copies = [s for s in samples if s.workload == "copy"]
    heavy = {s.round: s for s in copies if s.arm == "heavy"}
    rows = []
    for arm, _ in COPY_ARMS:
        mine = [s for s in copies if s.arm == arm]
        if not mine:
            continue
        ratios = [s.tokens_per_s / heavy[s.round].tokens_per_s for s in mine]
        rows.append({"arm": arm, "tokens_per_s": statistics.mean(s.tokens_per_s for s in mine),
                     "speedup_vs_heavy": statistics.mean(ratios), "min_speedup": min(ratios),
                     "identical_to_heavy": sum(s.text == heavy[s.round].text for s in mine), "prompts": len(mine),
                     "ngram_accepted": sum(s.ngram_accepted for s in mine),
                     "ngram_proposed": sum(s.ngram_proposed for s in mine)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenrouter_backend.bench.reuse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="gRPC host:port of a running TokenRouter server")
    p.add_argument("--repo", type=Path, required=True, help="its model repository (the tokenizer's chat template)")
    p.add_argument("--workloads", default="reuse,copy")
    p.add_argument("--modes", default="heavy,verify", help="reuse workload modes")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--context-tokens", type=int, default=1400)
    p.add_argument("--questions", type=int, default=3, help="requests per context (the first is cold)")
    p.add_argument("--copy-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32, help="reuse workload answer length")
    p.add_argument("--copy-max-tokens", type=int, default=160)
    p.add_argument("--repeat-prompts", type=int, default=4)
    p.add_argument("--window-lengths", default="1448,2800", help="window workload prompt sizes (tokens)")
    p.add_argument("--window", type=int, default=512, help="window workload: the light_kv_window tried")
    p.add_argument("--window-schedule", default="fixed", choices=("fixed", "heuristic"),
                   help="window workload block schedule (heuristic: the cost model may skip the light model)")
    p.add_argument("--metrics-url", default=None, help="the server's metrics URL (window workload: light KV peak)")
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    a = p.parse_args(argv)
    workloads = a.workloads.split(",")
    samples: list[Sample] = []
    if "reuse" in workloads:
        samples += reuse_runs(a.url, a.modes.split(","), a.rounds, a.context_tokens, a.questions, a.max_tokens)
    if "copy" in workloads:
        samples += copy_runs(a.url, a.repo, a.copy_prompts, a.copy_max_tokens)
    if "repeat" in workloads:
        samples += repeat_runs(a.url, a.repeat_prompts, a.max_tokens)
    if "window" in workloads:
        lengths = [int(n) for n in a.window_lengths.split(",")]
        samples += window_runs(a.url, a.metrics_url, lengths, a.window, a.max_tokens, a.window_schedule)
    report = {"reuse": reuse_table(samples) if "reuse" in workloads else [],
              "copy": copy_table(samples) if "copy" in workloads else [],
              "repeat": repeat_table(samples),
              "window": window_table(samples),
              "samples": [asdict(s) for s in samples]}
    for row in report["reuse"] + report["copy"] + report["repeat"] + report["window"]:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "reuse.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
