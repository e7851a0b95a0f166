#!/usr/bin/env python
"""Two freshly started servers, the same short sequence of requests: do the two commits give
the same answers when neither server has a history?

    .venv/bin/python research/studies/fresh_servers_ab.py --a HOST:PORT --b HOST:PORT --repo REPO

The cases where two long-running servers' answers differed (``two_server_ab.py``,
``block_cut_ab.py``): HumanEval chat problem 6 in route (learned router) at fixed blocks of
1, and the ``binary_search`` / ``fib`` code prompts sampled (seed 1234) in verify and route at fixed
blocks of 4. Each server gets the whole sequence in the same order (prewarm, then the
requests), server A first, then server B; answer cache off.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tokenrouter_backend.bench.arm_prompts import NO_REUSE_KNOBS
from tokenrouter_backend.bench.humaneval import CHAT_STOPS, chat_prompt, prewarm
from tokenrouter_backend.bench.workloads import CODE_PROMPTS, humaneval_problems
from tokenrouter_backend.client.triton_client import generate_http
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR, ChatTemplate

SAMPLED = {"temperature": 0.8, "top_p": 0.95, "random_seed": 1234}


def cases(repo: Path) -> list[tuple[str, str, dict]]:
    he6 = chat_prompt(humaneval_problems()[6], ChatTemplate(repo / TOKENIZER_DIR).render)
    out = [("humaneval6 route block 1", he6, {"router_mode": "route", "learned_router": True, "max_tokens": 512,
                                              "stop_words": list(CHAT_STOPS), "block_schedule": "fixed",
                                              "block_size": 1})]
    for name in ("binary_search", "fib"):
        for mode in ("verify", "route"):
            out.append((f"{name} {mode} sampled block 4", CODE_PROMPTS[name],
                        {"router_mode": mode, "max_tokens": 96, "block_schedule": "fixed", "block_size": 4, **SAMPLED}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True)
    parser.add_argument("--b", required=True)
    parser.add_argument("--repo", required=True, type=Path)
    args = parser.parse_args()
    todo = cases(args.repo)
    answers: dict[str, dict[str, str]] = {}
    for server, url in (("A", args.a), ("B", args.b)):
        for label, prompt, knobs in todo:
            prewarm(url, prompt)
            answers.setdefault(label, {})[server] = generate_http(url, prompt, **NO_REUSE_KNOBS, **knobs).text
    for label, by_server in answers.items():
        print(f"{label:34s} identical={by_server['A'] == by_server['B']}")


if __name__ == "__main__":
    main()
