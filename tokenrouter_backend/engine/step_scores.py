"""What a branch step returns: logits scored per row, and an op's ``BranchResult``.

``score_rows`` chooses a token per row of logits (greedy, or sampled at each row's sequence
position) and records on the op in flight its probability, the entropy, the top-1 minus
top-2 margin (``top_margin``) and, when asked, the distribution and the raw log-probabilities
(``raw_logprobs``: log-softmax of the logits, the chosen token's and the top k). Greedy rows
take one exp pass over the vocabulary (``greedy_rows``), never a full normalized softmax. ``op_result``
assembles an op's scores into its ``BranchResult``; ``empty_result`` answers a release.
Framework-free (numpy).
"""
from __future__ import annotations

import numpy as np

from tokenrouter_backend.core.loop import sampling as smp
from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
from tokenrouter_backend.engine.forward_plan import OpWork


def score_rows(w: OpWork, logits: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Choose a token per row; record choice, its probability, entropy, margin (and dist,
    and with ``op.logprobs`` >= 0 the raw log-probabilities).

    Returns (weights [rows, V], scale [rows]): the distribution is weights * scale, so
    greedy rows never divide the full vocabulary unless a dist is asked for.
    """
    raw = logits
    logits = processed_logits(w, logits, positions)
    sampling = w.op.sampling
    if sampling.greedy:
        chosen, weights, scale, ent = greedy_rows(logits)
        token_probs = scale  # the top-1 weight is exp(0) = 1
    else:
        weights = smp.processed_probs(logits, sampling)  # the only full-vocab softmax
        scale = np.ones(len(weights), dtype=np.float32)
        chosen = smp.choose(weights, sampling, positions)
        token_probs = weights[np.arange(len(chosen)), chosen]
        ent = smp.entropy(weights)
    w.tokens.append(chosen.astype(np.int32))
    w.probs.append(token_probs.astype(np.float32))
    w.entropy.append(ent.astype(np.float32))
    w.margins.append(top_margin(weights, scale))
    if w.op.return_dist:
        w.dists.append(weights * scale[:, None])
    if w.op.logprobs >= 0:  # a greedy row of unprocessed logits has its normalizer already: max + log(sum)
        known = logits is raw and sampling.greedy
        norm = (raw[np.arange(len(raw)), chosen].astype(np.float64) - np.log(scale.astype(np.float64))) if known \
            else None
        raw_logprobs(w, raw, chosen, norm)
    return weights, scale


SUPPRESSED = np.float32(-1e30)  # a suppressed token's logit: exp() is 0, 0 * it is not NaN


def processed_logits(w: OpWork, logits: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``op.processors`` applied to each row (the row at ``positions[r]``): a copy, or the
    logits themselves when there are none (``core/protocol/logit_processors.py``)."""
    p = w.op.processors
    if p is None or not p.active:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    bias_ids = np.asarray([t for t, _ in p.bias], np.int64)
    bias = np.asarray([v for _, v in p.bias], np.float32)
    seen = np.asarray(p.prompt_seen, np.int64)
    for r, q in enumerate(np.asarray(positions).tolist()):
        row = out[r]
        if p.counting():
            earlier = np.asarray(w.answer_before(q), np.int64)
            if p.repetition != 1.0:
                ids = np.unique(np.concatenate([seen, earlier]))
                v = row[ids]
                row[ids] = np.where(v > 0, v / p.repetition, v * p.repetition)
            if (p.frequency or p.presence) and len(earlier):
                ids, counts = np.unique(earlier, return_counts=True)
                row[ids] -= (p.frequency * counts + p.presence).astype(np.float32)
        if len(bias_ids):
            row[bias_ids] += bias
        if p.min_tokens and q - p.answer_start < p.min_tokens and p.ends:
            row[list(p.ends)] = SUPPRESSED
    return out


def log_normalizer(logits: np.ndarray) -> np.ndarray:
    """float64 [rows]: log sum exp of each row of logits (the raw log-softmax's offset)."""
    top = logits.max(axis=-1).astype(np.float64)
    return top + np.log(np.exp(logits - top[:, None].astype(logits.dtype)).sum(axis=-1, dtype=np.float64))


def raw_logprobs(w: OpWork, logits: np.ndarray, chosen: np.ndarray, norm: np.ndarray | None = None) -> None:
    """Record the raw log-probability of each row's chosen token and, with ``op.logprobs`` = k
    > 0, the k most likely tokens (most likely first); keeps the rows' normalizer (``norm``:
    given when known) for the next-input log-probabilities (``input_logprobs``)."""
    rows = np.arange(len(logits))
    norm = log_normalizer(logits) if norm is None else norm
    w.last_norm = norm
    w.logprobs.append((logits[rows, chosen] - norm).astype(np.float32))
    k = min(w.op.logprobs, logits.shape[-1])
    if k > 0:
        top = np.argpartition(logits, -k, axis=-1)[:, -k:]
        order = np.argsort(-np.take_along_axis(logits, top, axis=-1), axis=-1, kind="stable")
        top = np.take_along_axis(top, order, axis=-1)
        w.top_ids.append(top.astype(np.int32))
        w.top_logprobs.append((np.take_along_axis(logits, top, axis=-1) - norm[:, None]).astype(np.float32))


def greedy_rows(logits: np.ndarray):
    """Softmax facts of logits [rows, V] in one exp pass: argmax, exp(z), 1/sum, entropy.

    With z = logits - rowmax, p = exp(z) / S, S = sum exp(z): top-1 p = 1/S and the entropy
    -sum p log p = log S - sum(exp(z) z) / S (no log over the vocabulary).
    """
    rows = np.arange(len(logits))
    top = logits.argmax(axis=-1)
    z = logits - logits[rows, top][:, None]  # float32 copy; the max is at 0
    weights = np.exp(z)
    total = weights.sum(axis=-1)
    ent = np.log(total) - np.einsum("ij,ij->i", weights, z) / total
    return top, weights, (1.0 / total).astype(np.float32), ent


def top_margin(weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 [rows]: top-1 minus top-2 probability of the distributions weights * scale.

    Two max passes (the top entry masked for the second, then restored): cheaper than
    np.partition by about 5x on a 32k vocabulary. A 1-token vocabulary: p1.
    """
    rows = np.arange(len(weights))
    top = weights.argmax(axis=-1)
    first = weights[rows, top].copy()
    if weights.shape[-1] < 2:
        return (first * scale).astype(np.float32)
    weights[rows, top] = -np.inf
    second = weights.max(axis=-1)
    weights[rows, top] = first
    return ((first - second) * scale).astype(np.float32)


def op_result(w: OpWork, lone_steps: bool) -> BranchResult:
    """The ``BranchResult`` of a finished op: its scores concatenated, its forwards' costs."""
    return BranchResult(
        tokens=np.concatenate(w.tokens).astype(np.int32),
        token_probs=np.concatenate(w.probs),
        entropy=np.concatenate(w.entropy),
        input_probs=np.concatenate(w.input_probs) if w.input_probs else np.zeros(0, np.float32),
        session_len=w.session.length,
        dist=np.concatenate(w.dists).astype(np.float32, copy=False) if w.op.return_dist else None,
        forward_ms=w.forward_ms,
        batch_size=w.batch_size,
        forward_tokens=w.forward_tokens,
        forwards=w.forwards,
        reused_tokens=w.reused,
        margin=np.concatenate(w.margins) if w.margins else np.zeros(0, np.float32),
        lone_steps=lone_steps,
        token_logprobs=_joined(w.logprobs),
        input_logprobs=_joined(w.input_logprobs),
        top_ids=np.concatenate(w.top_ids).astype(np.int32) if w.top_ids else np.zeros((0, 0), np.int32),
        top_logprobs=np.concatenate(w.top_logprobs) if w.top_logprobs else np.zeros((0, 0), np.float32),
    )


def _joined(chunks: list) -> np.ndarray:
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


def empty_result() -> BranchResult:
    """The result of a release (nothing fed, nothing scored)."""
    empty_i = np.zeros(0, dtype=np.int32)
    empty_f = np.zeros(0, dtype=np.float32)
    return BranchResult(tokens=empty_i, token_probs=empty_f, entropy=empty_f, input_probs=empty_f,
                        session_len=0, batch_size=0)
