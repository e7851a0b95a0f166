#!/usr/bin/env python
"""One HumanEval chat problem on two servers at fixed block sizes: does a difference between
the servers' answers come from the code, or from where the cost model cut the blocks?

    .venv/bin/python research/studies/block_cut_ab.py --a HOST:PORT --b HOST:PORT --repo REPO \
        --problem 6 --blocks 1,2,4,8 --out OUT.jsonl

Route with the server's learned router (``learned_router``), ``block_schedule: fixed`` at
each block size, greedy, answer cache off, both servers prewarmed with the prompt. Prints,
per block size, whether the two servers' answers are identical and which distinct answers
there are.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenrouter_backend.bench.arm_prompts import NO_REUSE_KNOBS
from tokenrouter_backend.bench.humaneval import CHAT_STOPS, chat_prompt, prewarm
from tokenrouter_backend.bench.workloads import humaneval_problems
from tokenrouter_backend.client.triton_client import generate_http
from tokenrouter_backend.openai_front.chat_template import TOKENIZER_DIR, ChatTemplate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="HTTP host:port of server A")
    parser.add_argument("--b", required=True, help="HTTP host:port of server B")
    parser.add_argument("--repo", required=True, help="the exported repository (its router tokenizer renders chat)")
    parser.add_argument("--problem", type=int, default=6)
    parser.add_argument("--blocks", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    problem = humaneval_problems()[args.problem]
    prompt = chat_prompt(problem, ChatTemplate(Path(args.repo) / TOKENIZER_DIR).render)
    servers = {"A": args.a, "B": args.b}
    for url in servers.values():
        prewarm(url, prompt)
    texts_seen: dict[str, int] = {}
    with open(args.out, "w") as out:
        for i, block in enumerate(int(b) for b in args.blocks.split(",")):
            texts = {}
            for server, url in (list(servers.items()) if i % 2 == 0 else list(servers.items())[::-1]):
                res = generate_http(url, prompt, max_tokens=args.max_tokens, stop_words=list(CHAT_STOPS),
                                    router_mode="route", learned_router=True, block_schedule="fixed",
                                    block_size=block, **NO_REUSE_KNOBS)
                texts[server] = res.text
                texts_seen.setdefault(res.text, len(texts_seen))
                out.write(json.dumps({"problem": problem["task_id"], "block_size": block, "server": server,
                                      "tokens": res.stats["generated_tokens"], "text": res.text}) + "\n")
            print(f"block {block}: identical={texts['A'] == texts['B']} "
                  f"answers A=#{texts_seen[texts['A']]} B=#{texts_seen[texts['B']]}", flush=True)


if __name__ == "__main__":
    main()
