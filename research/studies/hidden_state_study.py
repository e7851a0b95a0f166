#!/usr/bin/env python
"""Does a projection of the light model's last hidden state pay as a learned-router feature?

    .venv/bin/python research/studies/hidden_state_study.py REPO/router/1/router_train.jsonl LIGHT_MODEL \
        REPO/router/1/tokenizer

LIGHT_MODEL: the light model's .gguf file or HF folder. Records: the verify-mode decision
records ``tokenrouter export --train-router`` wrote (router_train.jsonl). For each heavy
verdict, the light model's final hidden state at the position that predicted the drafted
token (transformers, FP32). Leave-prompts-out cross-validation (5 folds by prompt): held-out
log loss, AUC and the unchecked share reachable at agreement >= 0.985 / 0.99 of logistic
regressions on (a) confidence only, (b) the router's features, (c) (b) plus a PCA-k
projection of the hidden state (the PCA fitted on the training folds only).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import final_sequences, hidden_rows, load_light_model

from tokenrouter_backend.learning.router_training import collect_samples, fit_logistic
from tokenrouter_backend.operations.decision_log import read_log

FOLDS = 5
PCA_DIMS = (4, 8, 16, 32)


def auc(p: np.ndarray, y: np.ndarray) -> float:
    ranks = np.empty(len(p))
    ranks[np.argsort(p)] = np.arange(1, len(p) + 1)
    pos, neg = y.sum(), len(y) - y.sum()
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def unchecked_at(p: np.ndarray, y: np.ndarray, target: float) -> float:
    """Largest share of drafts that can stand (lowest P(disagree) first) at agreement >= target."""
    agree = ~y[np.argsort(p)]
    ok = np.nonzero(np.cumsum(agree) / np.arange(1, len(p) + 1) >= target)[0]
    return (ok.max() + 1) / len(p) if len(ok) else 0.0


def predict(xtr, ytr, xte) -> np.ndarray:
    cols = xtr.std(0) > 1e-9
    w, b, mean, scale = fit_logistic(xtr[:, cols], ytr)
    return 1 / (1 + np.exp(-np.clip(((xte[:, cols] - mean[None]) / scale) @ w + b, -40, 40)))


def with_pca(x, hidden, k):
    def make(tr, te):
        mu = hidden[tr].mean(0)
        vt = np.linalg.svd(hidden[tr] - mu, full_matrices=False)[2][:k]
        return np.hstack([x[tr], (hidden[tr] - mu) @ vt.T]), np.hstack([x[te], (hidden[te] - mu) @ vt.T])
    return make


def main(records_path: str, light_model: str, tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    records = list(read_log(Path(records_path)))
    sequences, prompt_lens = final_sequences(records, AutoTokenizer.from_pretrained(tokenizer_dir))
    hidden = hidden_rows(records, load_light_model(Path(light_model)), sequences, prompt_lens)
    s = collect_samples(records)
    assert len(hidden) == len(s), (len(hidden), len(s))
    y, keys = s.disagree, np.unique(s.requests)
    folds = np.random.default_rng(0).permutation(len(keys)) % FOLDS
    variants = {"confidence": lambda tr, te: (s.x[tr][:, :2], s.x[te][:, :2]),
                "router features": lambda tr, te: (s.x[tr], s.x[te])}
    variants.update({f"router + hidden PCA-{k}": with_pca(s.x, hidden, k) for k in PCA_DIMS})
    print(f"{len(y)} verdicts, {y.mean():.3f} disagree, {len(keys)} prompts, {FOLDS} folds by prompt")
    for name, make in variants.items():
        p = np.zeros(len(y))
        for fold in range(FOLDS):
            te = np.isin(s.requests, keys[folds == fold])
            xtr, xte = make(~te, te)
            p[te] = predict(xtr, y[~te], xte)
        pc = np.clip(p, 1e-6, 1 - 1e-6)
        loss = -np.mean(y * np.log(pc) + (~y) * np.log(1 - pc))
        print(f"{name:24s} log loss {loss:.4f}  AUC {auc(p, y):.4f}  unchecked at agreement >= 0.985: "
              f"{unchecked_at(p, y, 0.985):.3f}, >= 0.99: {unchecked_at(p, y, 0.99):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", help="REPO/router/1/router_train.jsonl (verify-mode decision records)")
    ap.add_argument("light_model", help="the light model's .gguf file or HF folder")
    ap.add_argument("tokenizer", help="REPO/router/1/tokenizer")
    a = ap.parse_args()
    main(a.records, a.light_model, a.tokenizer)
