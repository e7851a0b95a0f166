#!/usr/bin/env python
"""Does a projection of the light model's last hidden state pay as a learned-router feature?

    .venv/bin/python scripts/hidden_state_study.py REPO/router/1/router_train.jsonl LIGHT_MODEL REPO/router/1/tokenizer

LIGHT_MODEL: the light model's .gguf file or HF folder. Records: the verify-mode decision
records ``tokenrouter export --train-router`` wrote (router_train.jsonl). For each heavy
verdict, the light model's final hidden state at the position that predicted the drafted
token (transformers, FP32). Leave-prompts-out cross-validation (5 folds by prompt): held-out
log loss, AUC and the unchecked share reachable at agreement >= 0.985 / 0.99 of logistic
regressions on (a) confidence only, (b) the router's features, (c) (b) plus a PCA-k
projection of the hidden state (the PCA fitted on the training folds only).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tokenrouter_backend.export.router_build import prompt_ids
from tokenrouter_backend.export.router_prompts import training_prompts
from tokenrouter_backend.operations.decision_log import read_log
from tokenrouter_backend.operations.router_training import collect_samples, fit_logistic, sampled_drafts

FOLDS = 5
PCA_DIMS = (4, 8, 16, 32)


def final_sequences(records, tokenizer, prompts=None) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Each request's prompt + final answer (rebuilt from the records' outputs), and its prompt
    length. ``prompts``: request id -> TrainingPrompt (default: the exporter's training prompts)."""
    if prompts is None:
        prompts = {f"export/{p.name}": p for p in training_prompts()}
    answers: dict[str, list[int]] = {}
    for r in records:
        answers[r.request_id] = answers.get(r.request_id, [])[: r.output_from] + list(r.output)
    ids = {rid: prompt_ids(tokenizer, prompts[rid]) for rid in answers}
    return {rid: ids[rid] + ans for rid, ans in answers.items()}, {rid: len(ids[rid]) for rid in answers}


def load_light_model(light_model: Path):
    """The light model in FP32 transformers, from a .gguf file or an HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = {"gguf_file": light_model.name} if light_model.suffix == ".gguf" else {}
    return AutoModelForCausalLM.from_pretrained(light_model.parent if gguf else light_model,
                                                dtype=torch.float32, **gguf).eval()


def hidden_rows(records, model, sequences, prompt_lens) -> np.ndarray:
    """[verdicts, hidden]: in collect_samples' order, the state that predicted each verdict's draft."""
    import torch

    with torch.no_grad():
        hidden = {rid: model(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0].numpy()
                  for rid, seq in sequences.items()}
    rows = []
    for r in records:
        n = sampled_drafts(r)
        if n == 0:
            continue
        base = prompt_lens[r.request_id] + r.position
        rows += [hidden[r.request_id][base + j - 1] for j in range(n)]
    return np.asarray(rows)


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
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:4])
