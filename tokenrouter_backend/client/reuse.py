"""Reuse workloads side by side: a shared long context (prefix cache) and copy-heavy edits
(n-gram drafts).

``python -m tokenrouter_backend.client.reuse --url HOST:PORT --repo REPO`` runs against a
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

Output: tables on stdout and ``OUT/reuse.json``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

from . import triton_client
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
            context = rag_prompt(context_tokens, offset=7 * (rnd * len(modes) + i))[: -len(QUESTION)]
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
        triton_client.generate_grpc(url, prompt, stream=True, max_tokens=2, router_mode="verify", ngram_drafts=False)
        arms = COPY_ARMS[rnd % len(COPY_ARMS):] + COPY_ARMS[:rnd % len(COPY_ARMS)]
        for arm, knobs in arms:
            out.append(sample(url, "copy", arm, rnd, "copy", prompt, max_tokens, **knobs))
            s = out[-1]
            print(f"copy {func.__name__} {arm}: {s.tokens} tokens in {s.total_s:.1f} s = {s.tokens_per_s:.2f} tok/s, "
                  f"n-gram {s.ngram_accepted}/{s.ngram_proposed}", flush=True)
    return out


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
    p = argparse.ArgumentParser(prog="python -m tokenrouter_backend.client.reuse", description=__doc__,
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
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    a = p.parse_args(argv)
    workloads = a.workloads.split(",")
    samples: list[Sample] = []
    if "reuse" in workloads:
        samples += reuse_runs(a.url, a.modes.split(","), a.rounds, a.context_tokens, a.questions, a.max_tokens)
    if "copy" in workloads:
        samples += copy_runs(a.url, a.repo, a.copy_prompts, a.copy_max_tokens)
    report = {"reuse": reuse_table(samples) if "reuse" in workloads else [],
              "copy": copy_table(samples) if "copy" in workloads else [],
              "samples": [asdict(s) for s in samples]}
    for row in report["reuse"] + report["copy"]:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "reuse.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
