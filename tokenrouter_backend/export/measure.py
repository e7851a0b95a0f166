"""Decode-step timing on the same inputs for ONNX Runtime (``OnnxCausalLM``) and
transformers eager: batch B, past length P, S new tokens, median over repeats.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

DEFAULT_PAST = 128
DEFAULT_REPEATS = 10
WARMUP = 2


def _median_ms(fn, repeats: int) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def step_inputs(info, batch: int, past: int, new: int, seed: int = 0):
    """Random ids (within vocab), full masks, positions and a random KV past (numpy)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, min(info.vocab_size, 1000), size=(batch, new), dtype=np.int64)
    mask = np.ones((batch, past + new), dtype=np.int64)
    pos = np.tile(np.arange(past, past + new, dtype=np.int64), (batch, 1))
    shape = (batch, info.num_kv_heads, past, info.head_dim)
    kv = [(rng.standard_normal(shape).astype(info.np_kv_dtype), rng.standard_normal(shape).astype(info.np_kv_dtype))
          for _ in range(info.num_layers)]
    return ids, mask, pos, kv


def onnx_step_ms(lm, batch: int, past: int = DEFAULT_PAST, new: int = 1, repeats: int = DEFAULT_REPEATS) -> float:
    ids, mask, pos, kv = step_inputs(lm.info, batch, past, new)
    return _median_ms(lambda: lm.forward(ids, mask, pos, kv), repeats)


def torch_step_ms(model, info, batch: int, past: int = DEFAULT_PAST, new: int = 1,
                  repeats: int = DEFAULT_REPEATS) -> float:
    """transformers eager on the same inputs (a fresh DynamicCache per call)."""
    import torch
    from transformers import DynamicCache

    ids, mask, pos, kv = step_inputs(info, batch, past, new)
    t_ids, t_mask, t_pos = (torch.from_numpy(x) for x in (ids, mask, pos))
    dtype = next(model.parameters()).dtype
    t_kv = [(torch.from_numpy(k).to(dtype), torch.from_numpy(v).to(dtype)) for k, v in kv]

    def run():
        cache = DynamicCache(config=model.config)
        for i, (k, v) in enumerate(t_kv):
            cache.update(k, v, i)
        with torch.no_grad():
            model(input_ids=t_ids, attention_mask=t_mask, position_ids=t_pos, past_key_values=cache, use_cache=True)

    return _median_ms(run, repeats)
