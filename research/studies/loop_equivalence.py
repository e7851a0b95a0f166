#!/usr/bin/env python
"""The block loop's behaviour as data, so that two checkouts can be compared.

    .venv/bin/python research/studies/loop_equivalence.py run OUT.json     # in each checkout
    .venv/bin/python research/studies/loop_equivalence.py compare A.json B.json

Many ``generate()`` runs on the test suite's fake branches (``tests/support/fakes.py``):
every mode, streamed or not, greedy or seeded sampling, fixed or heuristic block schedule,
n-gram drafts and light copies on or off, stop tokens (end_id and a two-token stop
sequence) or none, no hooks / hooks that only record / hooks that plan heavy-only steps with
model-free drafts, degraded and smaller blocks, a decision cache, seven prompts (three of
them repeating themselves) and two light-model noise levels. Written per run: the emitted
chunks, ``routing_stats`` without timings (token kinds included), every block record without
timings, and each branch's call count. Run from the repository root.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import sys

import numpy as np

sys.path.insert(0, "tests")
from support.fakes import VOCAB, FakeBranch, ToyLM  # noqa: E402

try:  # the core foldered by purpose
    from tokenrouter_backend.core.loop.answer_cache import AnswerCache
    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
    from tokenrouter_backend.core.loop.hooks import BlockPlan
    from tokenrouter_backend.core.protocol.names import Mode
    from tokenrouter_backend.core.protocol.params import RouterDefaults
except ImportError:  # the flat core before it
    from tokenrouter_backend.core.answer_cache import AnswerCache
    from tokenrouter_backend.core.block_loop import GenerationRequest, generate
    from tokenrouter_backend.core.hooks import BlockPlan
    from tokenrouter_backend.core.names import Mode
    from tokenrouter_backend.core.params import RouterDefaults

_rng = np.random.default_rng(7)
_BASE = [tuple(int(x) for x in _rng.integers(0, VOCAB, size=6)) for _ in range(4)]
PROMPTS = _BASE + [tuple(list(b) * 3) for b in _BASE[:3]]
TIMINGS = ("heavy_ms", "heavy_forward_ms", "light_ms", "latency_ms")


class Planner:
    """BlockHooks: ``same`` records only; ``heavy3`` plans every third block heavy-only (with
    or without model-free drafts) and the others one draft shorter, some degraded."""

    def __init__(self, kind: str):
        self.kind, self.blocks, self.records = kind, 0, []

    def plan(self, params, block):
        self.blocks += 1
        n = self.blocks
        if self.kind == "heavy3" and params.mode in (Mode.VERIFY, Mode.ROUTE):
            if n % 3 == 0:
                return BlockPlan(params, params.block_size, Mode.HEAVY, free_drafts=4 if n % 2 else None)
            return BlockPlan(params, max(1, block - 1), params.mode, free_drafts=3, degraded=n % 4 == 0)
        return BlockPlan(params, block, params.mode)

    def after_block(self, record) -> None:
        fields = {k: v for k, v in dataclasses.asdict(record).items() if k not in TIMINGS}
        self.records.append(json.loads(json.dumps(fields, default=str)))


def untimed(stats) -> dict:
    d = {k: v for k, v in stats.to_dict().items() if not k.endswith("_ms")}
    d["token_kinds"] = stats.token_kinds
    return d


def scenarios():
    for key in itertools.product(["heavy", "light", "verify", "route"], [False, True], [0.0, 0.9],
                                 ["fixed", "heuristic"], [False, True], [False, True], [False, True],
                                 ["none", "same", "heavy3"], range(len(PROMPTS)), [0.6, 1.5]):
        mode, _, _, schedule, ngram, copies, _, hooks, prompt_i, noise = key
        if mode in ("heavy", "light") and (ngram or copies or hooks == "heavy3" or noise > 1):
            continue
        if prompt_i % 2 and (copies or schedule == "fixed"):
            continue
        yield key


def run(path: str) -> None:
    out, answers = [], AnswerCache(64)
    for key in scenarios():
        mode, stream, temperature, schedule, ngram, copies, stops, hooks, prompt_i, noise = key
        params = RouterDefaults(heavy_first=True).request_params({
            "router_mode": mode, "max_tokens": 40, "stream": stream, "temperature": temperature, "random_seed": 11,
            "block_schedule": schedule, "ngram_drafts": ngram, "light_copies": copies,
            "confidence_threshold": 0.5, "rollback_threshold": 0.3})
        request = GenerationRequest(PROMPTS[prompt_i], params, end_id=5 if stops else None,
                                    stop_sequences=((7, 8),) if stops else ())
        light, heavy = FakeBranch("light", ToyLM(seed=3, noise=noise)), FakeBranch("heavy", ToyLM())
        planner = None if hooks == "none" else Planner(hooks)
        emitted: list[list] = []

        def emit(tokens, stats, finished, chunks=emitted):
            chunks.append([int(x) for x in tokens] + [finished])

        stats = asyncio.run(generate(request, light, heavy, emit, session_id=1, hooks=planner, request_id="r",
                                     answers=answers if ngram and prompt_i == 0 else None))
        out.append({"key": list(key), "emitted": emitted, "stats": untimed(stats),
                    "records": planner.records if planner else None, "calls": [light.calls, heavy.calls]})
    with open(path, "w") as f:
        json.dump(out, f, sort_keys=True)
    print(len(out), "scenarios")


def compare(a_path: str, b_path: str) -> None:
    with open(a_path) as fa, open(b_path) as fb:
        a, b = json.load(fa), json.load(fb)
    assert [x["key"] for x in a] == [y["key"] for y in b], "the two runs ran other scenarios"
    differ = [x["key"] for x, y in zip(a, b) if x != y]
    print(f"{len(a)} scenarios, {len(differ)} differ")
    for key in differ[:10]:
        print("  ", key)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the block loop's behaviour as data, two checkouts compared")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("out")
    both = sub.add_parser("compare")
    both.add_argument("a")
    both.add_argument("b")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
    else:
        compare(args.a, args.b)
