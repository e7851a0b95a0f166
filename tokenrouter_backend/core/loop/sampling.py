"""Logits -> processed next-token distributions, choices, confidence and entropy.

One implementation for both branches and the router's acceptance math: temperature, top-k
and top-p are applied here and nowhere else. All functions work on a 2-D array of rows
(one row per position) and are pure numpy.
"""
from __future__ import annotations

import numpy as np

from tokenrouter_backend.core.protocol.branch_protocol import Sampling


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (logits [N, V] -> probs [N, V])."""
    z = logits.astype(np.float32, copy=True)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of probs [N, V] -> [N]."""
    p = np.clip(probs, 1e-30, 1.0)
    return -(probs * np.log(p)).sum(axis=-1).astype(np.float32)


def processed_probs(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The distribution a token is drawn from: softmax(logits / T) cut by top-k and top-p.

    Greedy requests get the plain softmax (T = 1): its top-1 is the greedy choice and its
    top-1 probability is the confidence signal the policy thresholds.
    """
    if sampling.greedy:
        return softmax(logits)
    probs = softmax(logits / np.float32(sampling.temperature))
    vocab = probs.shape[-1]
    if 0 < sampling.top_k < vocab:
        # keep the k largest of each row
        kth = np.partition(probs, vocab - sampling.top_k, axis=-1)[:, vocab - sampling.top_k][:, None]
        probs = np.where(probs >= kth, probs, 0.0)
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        cum = np.cumsum(sorted_p, axis=-1) / sorted_p.sum(axis=-1, keepdims=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep_sorted = (cum - sorted_p / sorted_p.sum(axis=-1, keepdims=True)) < sampling.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
    if sampling.min_p > 0.0:  # vLLM's min-p, after top-k / top-p: keep p >= min_p x the top p
        probs = np.where(probs >= sampling.min_p * probs.max(axis=-1, keepdims=True), probs, 0.0)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs.astype(np.float32)


def position_rng(seed: int, position: int, stream: int = 0) -> np.random.Generator:
    """The generator of the draws for the token at sequence index ``position``.

    Position p always means "the token at index p of prompt + generated text", in every mode
    and at every block size or batch, so a seeded request samples the same text whatever
    the block size, batching or timing. A counter-based Philox generator: the key is the
    seed (64 bits), the counter holds (stream, position) in separate words, so distinct
    (seed, position, stream) never share draws (``stream`` 0: the branches' token draws;
    acceptance uses its own stream).
    """
    if not 0 <= position < 1 << 64 or not 0 <= stream < 1 << 64:
        raise ValueError(f"position {position} / stream {stream} outside 0..2**64-1")
    key = np.array([int(seed) & 0xFFFFFFFFFFFFFFFF, 0], dtype=np.uint64)
    counter = np.array([0, 0, int(stream), int(position)], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


def choose(probs: np.ndarray, sampling: Sampling, positions: np.ndarray) -> np.ndarray:
    """Pick one token per row: argmax when greedy, else a draw seeded by position."""
    if sampling.greedy:
        return probs.argmax(axis=-1).astype(np.int32)
    out = np.empty(probs.shape[0], dtype=np.int32)
    for i, pos in enumerate(positions):
        u = position_rng(sampling.seed, int(pos)).random()
        cdf = np.cumsum(probs[i], dtype=np.float64)
        out[i] = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), probs.shape[1] - 1)
    return out
