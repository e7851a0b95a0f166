#!/usr/bin/env python
"""Does the drafted token's identity (or R2R's full light-side feature set) lift the router above confidence?

    .venv/bin/python research/studies/token_identity_study.py LIGHT_MODEL TOKENIZER OUT

R2R routes on the small model's logits, the embedding of the token it predicts and its last
hidden state. The router's logit features sit on the confidence rule's frontier (the copy,
data and hidden-state studies); the drafted token's identity was the one R2R signal never
tried. This study tries it, and the hidden state again on eight times the verdicts of the
first hidden-state study, with leave-prompts-out cross-validation over every verify record
the earlier studies collected (same exported demo pair, block 4, drafting at every
position, 64 new tokens): the exporter's 20 training prompts and the workloads' 22
(``research/records/route_quality/copy_features_2026-12-06/``), and the 120 more prompts
(``research/records/route_quality/router_data_2026-12-06/more.jsonl``): 162 prompts in four kinds
(raw code, chat code, structured, prose/text).

LIGHT_MODEL: the light model's .gguf file or HF folder (transformers, FP32; its input
embedding and final hidden state). TOKENIZER: the exported ``router/1/tokenizer`` folder.

Variants, each a logistic regression fitted on 4 folds of prompts and scored on the 5th:

* router features: what ``train-router`` fits (confidence, its logit, entropy, margin,
  classes, position);
* + token table: the drafted token's smoothed disagreement rate on the training folds
  (its logit; counts from the draft's own prompt left out on the training side; unseen
  tokens get the prior);
* + token embedding: a PCA-16 projection of the light model's input embedding of the
  drafted token (generalises to tokens never seen in training);
* + hidden state: a PCA-16 projection of the light model's final hidden state at the
  position that predicted the draft;
* all three together.

PCA and token tables are fitted on the training folds only. A second section fits on the
140 training prompts and scores the 22 workload prompts only (the split the earlier
studies used). Report (``OUT/report.txt``): per kind, the held-out log loss and the
unchecked share each reaches at agreement >= A against the confidence-threshold frontier
on the same drafts (the default class policy for the router, as
``common.frontier_cells``).
"""
from __future__ import annotations

import argparse
import sys
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
from common import (
    AGREEMENTS,
    RECORDS_DIR,
    final_sequences,
    frontier_cells,
    hidden_rows,
    load_light_model,
    log_loss,
    scores,
)

from tokenrouter_backend.bench.workloads import CODE, STRUCTURED, TEXT, load_workloads
from tokenrouter_backend.learning.router_prompts import TrainingPrompt, training_prompts
from tokenrouter_backend.learning.router_prompts_more import more_training_prompts
from tokenrouter_backend.learning.router_training import collect_samples, fit_logistic, sampled_drafts
from tokenrouter_backend.operations.decision_log import read_log

BENCH = RECORDS_DIR / "route_quality"
RECORDS = (BENCH / "copy_features_2026-12-06" / "train.jsonl", BENCH / "router_data_2026-12-06" / "more.jsonl",
           BENCH / "copy_features_2026-12-06" / "eval.jsonl")
FOLDS, PCA_DIMS, TABLE_PRIOR_WEIGHT = 5, 16, 5.0
EXPORTER_KINDS = ["raw code"] * 8 + ["chat code"] * 4 + ["structured"] * 4 + ["text"] * 4  # router_prompts order
MORE_KINDS = ("raw code", "structured", "text", "chat code")  # router_prompts_more: 30 of each, in this order
WORKLOAD_KINDS = {CODE: "raw code", STRUCTURED: "structured", TEXT: "text"}  # run as raw text


def prompts_and_kinds() -> tuple[dict[str, TrainingPrompt], dict[str, str]]:
    """Every prompt the records hold, by request id, and its kind."""
    prompts, kinds = {}, {}
    exporter = training_prompts()
    for p, kind in zip(exporter, EXPORTER_KINDS, strict=True):
        prompts[f"export/{p.name}"], kinds[f"export/{p.name}"] = p, kind
    for i, p in enumerate(more_training_prompts()):
        prompts[f"export/{p.name}"], kinds[f"export/{p.name}"] = p, MORE_KINDS[i // 30]
    for w in load_workloads((CODE, STRUCTURED, TEXT)):
        prompts[f"export/{w.id}"], kinds[f"export/{w.id}"] = TrainingPrompt(w.id, w.text), WORKLOAD_KINDS[w.workload]
    return prompts, kinds


def token_embeddings(records, model) -> np.ndarray:
    """[verdicts, hidden]: the light model's input embedding of each draft, in ``collect_samples``' order."""
    import torch

    table = model.get_input_embeddings().weight
    with torch.no_grad():
        rows = [table[torch.tensor(r.drafted[:n])].numpy() for r in records if (n := sampled_drafts(r))]
    return np.concatenate(rows).astype(np.float64)


def drafted_tokens(records) -> np.ndarray:
    return np.concatenate([np.asarray(r.drafted[:n]) for r in records if (n := sampled_drafts(r))])


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def token_table(tokens, y, requests, train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The drafted token's smoothed disagreement logit: from the training folds, leaving each
    training draft's own prompt out of its count; unseen tokens get the training prior."""
    prior = y[train].mean()
    seen, wrong = defaultdict(float), defaultdict(float)
    own_seen, own_wrong = defaultdict(float), defaultdict(float)
    for t, bad, q in zip(tokens[train], y[train], requests[train]):
        seen[t] += 1
        wrong[t] += bad
        own_seen[q, t] += 1
        own_wrong[q, t] += bad
    w = TABLE_PRIOR_WEIGHT
    tr = [(wrong[t] - own_wrong[q, t] + w * prior) / (seen[t] - own_seen[q, t] + w)
          for t, q in zip(tokens[train], requests[train])]
    te = [(wrong[t] + w * prior) / (seen[t] + w) for t in tokens[test]]
    return _logit(np.asarray(tr))[:, None], _logit(np.asarray(te))[:, None]


def pca(rows: np.ndarray, train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu = rows[train].mean(axis=0)
    vt = np.linalg.svd(rows[train] - mu, full_matrices=False)[2][:PCA_DIMS]
    return (rows[train] - mu) @ vt.T, (rows[test] - mu) @ vt.T


VARIANTS = {"router features": (), "+ token table": ("table",), "+ token embedding": ("embedding",),
            "+ hidden state": ("hidden",), "+ all three": ("table", "embedding", "hidden")}


def predictions(x, y, requests, tokens, embeds, states, splits) -> dict[str, np.ndarray]:
    """Each variant's P(disagree) on every split's test drafts, fitted on its training drafts."""
    pred = {v: np.zeros(len(y)) for v in VARIANTS}
    for train, test in splits:
        extra = {"table": token_table(tokens, y, requests, train, test), "embedding": pca(embeds, train, test),
                 "hidden": pca(states, train, test)}
        for v, uses in VARIANTS.items():
            xtr = np.hstack([x[train]] + [extra[e][0] for e in uses])
            xte = np.hstack([x[test]] + [extra[e][1] for e in uses])
            pred[v][test] = scores(fit_logistic(xtr, y[train]), xte)
    return pred


def main(light_model: str, tokenizer_dir: str, out: str) -> None:
    from transformers import AutoTokenizer

    records = [r for path in RECORDS for r in read_log(path)]
    prompts, kinds = prompts_and_kinds()
    s = collect_samples(records)
    model = load_light_model(Path(light_model))
    sequences, prompt_lens = final_sequences(records, AutoTokenizer.from_pretrained(tokenizer_dir), prompts)
    states = hidden_rows(records, model, sequences, prompt_lens).astype(np.float64)
    embeds = token_embeddings(records, model)
    tokens = drafted_tokens(records)
    assert len(states) == len(embeds) == len(tokens) == len(s), (len(states), len(tokens), len(s))
    kind_of = {zlib.crc32(r.request_id.encode()): kinds[r.request_id] for r in records}
    kind = np.asarray([kind_of[k] for k in s.requests])
    known = ~np.isnan(s.x).any(axis=0) & (s.x.std(axis=0) > 1e-9)
    x, y = s.x[:, known], s.disagree
    keys = np.unique(s.requests)
    fold_of = dict(zip(keys, np.random.default_rng(0).permutation(len(keys)) % FOLDS))
    fold = np.asarray([fold_of[k] for k in s.requests])
    folds = [(fold != f, fold == f) for f in range(FOLDS)]
    workload_keys = {zlib.crc32(rid.encode()) for rid in prompts if rid.count("/") == 2}  # export/KIND/NAME
    on_workloads = np.isin(s.requests, list(workload_keys))
    sections = ((f"held-out folds ({FOLDS} folds by prompt, all 162 prompts)", folds, np.ones(len(y), bool)),
                ("the 22 workload prompts, fitted on the 140 training prompts", [(~on_workloads, on_workloads)],
                 on_workloads))
    lines = [f"{len(y)} verdicts of {len(keys)} prompts, {y.mean():.3f} disagree; PCA-{PCA_DIMS}; "
             f"token table prior weight {TABLE_PRIOR_WEIGHT:g}"]
    for title, splits, scored in sections:
        pred = predictions(x, y, s.requests, tokens, embeds, states, splits)
        lines += ["", f"unchecked share at agreement >= A, {title}: model / confidence frontier",
                  f"{'features, kind':<34}{'drafts':>7}{'log loss':>9}  " + "  ".join(f"{a:>11}" for a in AGREEMENTS)]
        for v in VARIANTS:
            for k in ("raw code", "chat code", "structured", "text", None):
                m = scored & (True if k is None else kind == k)
                if not m.any():
                    continue
                lines.append(f"{v + ', ' + (k or 'all'):<34}{int(m.sum()):>7}{log_loss(pred[v][m], y[m]):>9.4f}  "
                             + "  ".join(frontier_cells(pred[v][m], s.take(m))))
            lines.append("")
    text = "\n".join(lines)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "report.txt").write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("light_model", help="the light model's .gguf file or HF folder")
    ap.add_argument("tokenizer", help="the exported router/1/tokenizer folder")
    ap.add_argument("out", help="folder for report.txt")
    a = ap.parse_args()
    main(a.light_model, a.tokenizer, a.out)
