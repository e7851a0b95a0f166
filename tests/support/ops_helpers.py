"""Helpers for the operations tests: run requests in-process with hooks, collect records."""
from __future__ import annotations

import asyncio

import numpy as np

from support.fakes import VOCAB, ToyLM
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.hooks import BlockPlan
from tokenrouter_backend.core.protocol.params import RouterDefaults

PROMPTS = [tuple(int(x) for x in np.random.default_rng(100 + i).integers(0, VOCAB, size=4 + i % 5)) for i in range(40)]


class Recorder:
    """BlockHooks that change nothing and keep every record."""

    def __init__(self):
        self.records = []

    def plan(self, params, block):
        return BlockPlan(params, block, params.mode)

    def after_block(self, record):
        self.records.append(record)


def run_one(prompt, light, heavy, hooks=None, request_id="r", **given):
    defaults = RouterDefaults(heavy_first=given.pop("heavy_first", True))
    gate = given.pop("route_gate", None)
    params = defaults.request_params({"max_tokens": 32, **given})
    out = []
    stats = asyncio.run(generate(GenerationRequest(tuple(prompt), params, route_gate=gate), light, heavy,
                                 lambda t, s, f: out.extend(t), hooks=hooks, request_id=request_id))
    return out, stats


def heavy_agreement(prompt, output, lm: ToyLM) -> float:
    """Fraction of output tokens that are the heavy LM's greedy choice given the text before."""
    seq, agree = list(prompt), 0
    for t in output:
        agree += int(np.argmax(lm.logits(seq))) == t
        seq.append(t)
    return agree / len(output) if output else 1.0
