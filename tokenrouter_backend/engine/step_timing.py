"""Decode-step timing of a causal LM with the ``OnnxCausalLM`` interface (ONNX or torch runtime).

The one timing helper of the project: the exporter's INT8 pick, the GPU check and the
tests all measure a step with ``step_ms``.
"""
from __future__ import annotations

import time

import numpy as np


def step_ms(lm, batch: int, past_len: int, new: int = 1, warmup: int = 3, repeats: int = 20,
            pad: bool = True) -> float:
    """Median ms of one ``forward`` over ``new`` tokens at ``batch`` rows and ``past_len`` cached.
    ``pad=False``: a ``min_rows`` model's forward as given (the engine's lone decode steps)."""
    info = lm.info
    rng = np.random.default_rng(0)
    past = lm.empty_past(batch)
    if past_len:
        ids = rng.integers(0, info.vocab_size, size=(batch, past_len))
        _, past = lm.forward(ids, np.ones((batch, past_len), np.int64),
                             np.tile(np.arange(past_len), (batch, 1)), past)
    ids = rng.integers(0, info.vocab_size, size=(batch, new))
    mask = np.ones((batch, past_len + new), dtype=np.int64)
    pos = np.tile(np.arange(past_len, past_len + new), (batch, 1))
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        lm.forward(ids, mask, pos, past, **({} if pad else {"pad": False}))  # logits come to the host
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))
