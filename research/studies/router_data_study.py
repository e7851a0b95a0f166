#!/usr/bin/env python
"""Does the learned router beat the confidence frontier with more training verdicts?

    .venv/bin/python research/studies/router_data_study.py REPO OUT [--tokens 64] [--reuse DIR]

The demo router was trained on the exporter's 20 prompts (about 1,000 heavy verdicts); on
the unseen code / structured / text workloads it sits on the confidence rule's frontier.
This study collects verify-mode records on 120 more training prompts
(``learning/router_prompts_more.py``) and fits the router's logistic regression on growing
shares of them, to see whether the frontier gap is a matter of data.

REPO: an exported repository. The exported ONNX branches run in process in verify mode
(as ``export --train-router`` runs them: block 4, drafting at every position) on

* the exporter's 20 prompts: ``OUT/train.jsonl``;
* the 120 more prompts: ``OUT/more.jsonl``;
* the code, structured and text workloads (never trained on): ``OUT/eval.jsonl``.

Existing files are reused; ``--reuse DIR`` copies ``train.jsonl`` / ``eval.jsonl`` from an
earlier study's folder (same exporter settings) instead of running them again. Each fit is
replayed on the held-out workloads with the default class policy against the
confidence-threshold frontier (thresholds every 0.005): the unchecked share each reaches at
equal agreement, per workload and in all, and the held-out log loss. On all 140 prompts two
more models test what the features miss: a one-hidden-layer MLP on the same features
(numpy, Adam: does a non-linear model pay?) and the logistic regression with the next
drafts' confidence in the same block (the gate decides a block after drafting it, so what
the light model felt one token later is known: does its doubt after a draft tell that the
draft was wrong?). Report: ``OUT/report.txt``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np
from common import AGREEMENTS, frontier_cells, log_loss, run, scores, tokenizer_of

from tokenrouter_backend.bench.workloads import CODE, STRUCTURED, TEXT, load_workloads
from tokenrouter_backend.learning.router_prompts import TrainingPrompt, training_prompts
from tokenrouter_backend.learning.router_prompts_more import more_training_prompts
from tokenrouter_backend.learning.router_training import collect_samples, fit_logistic, sampled_drafts
from tokenrouter_backend.operations.decision_log import read_log

SHARES = (0.0, 0.25, 0.5, 1.0)  # share of the 120 more prompts added to the exporter's 20
MLP_HIDDEN, MLP_EPOCHS, MLP_L2 = 16, 400, 1e-3


def fit_mlp(x: np.ndarray, y: np.ndarray, seed: int = 0):
    """A one-hidden-layer tanh MLP (standardized x, full-batch Adam, L2); returns a scorer."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = (x - mean) / scale
    rng = np.random.default_rng(seed)
    params = [rng.normal(0, 1 / np.sqrt(z.shape[1]), (z.shape[1], MLP_HIDDEN)), np.zeros(MLP_HIDDEN),
              rng.normal(0, 1 / np.sqrt(MLP_HIDDEN), MLP_HIDDEN), np.zeros(1)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    yf = y.astype(float)
    for step in range(1, MLP_EPOCHS + 1):
        w1, b1, w2, b2 = params
        h = np.tanh(z @ w1 + b1)
        p = 1 / (1 + np.exp(-np.clip(h @ w2 + b2[0], -40, 40)))
        g = (p - yf) / len(z)
        gh = np.outer(g, w2) * (1 - h * h)
        grads = [z.T @ gh + MLP_L2 * w1, gh.sum(axis=0), h.T @ g + MLP_L2 * w2, np.array([g.sum()])]
        for i, gr in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * gr
            v[i] = 0.999 * v[i] + 0.001 * gr * gr
            params[i] = params[i] - 0.01 * (m[i] / (1 - 0.9 ** step)) / (np.sqrt(v[i] / (1 - 0.999 ** step)) + 1e-8)

    def score(xe: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = params
        return 1 / (1 + np.exp(-np.clip(np.tanh(((xe - mean) / scale) @ w1 + b1) @ w2 + b2[0], -40, 40)))
    return score


def next_columns(records) -> np.ndarray:
    """[samples, 3]: the next draft's confidence, the lowest confidence of the block's later
    drafts (both NaN for a block's last draft) and "last draft" (0/1), in ``collect_samples``' order."""
    rows = []
    for r in records:
        n = sampled_drafts(r)
        if n == 0:
            continue
        for j in range(n):
            later = list(r.confidence[j + 1:])
            rows.append((later[0], min(later), 0.0) if later else (np.nan, np.nan, 1.0))
    return np.asarray(rows, np.float64).reshape(-1, 3)


def with_next(x: np.ndarray, nxt: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """x plus the next-draft columns (NaN -> the training mean) and their logits."""
    a = nxt.copy()
    for k in range(2):
        a[np.isnan(a[:, k]), k] = fill[k]
    c = np.clip(a[:, :2], 1e-4, 1 - 1e-4)
    return np.hstack([x, a, np.log(c / (1 - c))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reuse", type=Path, help="a folder holding train.jsonl / eval.jsonl of the same exporter")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl"):
        if a.reuse and (a.reuse / name).exists() and not (a.out / name).exists():
            shutil.copy(a.reuse / name, a.out / name)
    tokenizer = tokenizer_of(a.repo)
    eval_prompts = [TrainingPrompt(p.id, p.text) for p in load_workloads((CODE, STRUCTURED, TEXT))]
    more = more_training_prompts()
    for path, prompts in ((a.out / "train.jsonl", training_prompts()), (a.out / "eval.jsonl", eval_prompts),
                          (a.out / "more.jsonl", more)):
        if not path.exists():
            run(a.repo, tokenizer, prompts, a.tokens, path)

    base = list(read_log(a.out / "train.jsonl"))
    extra = list(read_log(a.out / "more.jsonl"))
    ev_records = list(read_log(a.out / "eval.jsonl"))
    s_ev = collect_samples(ev_records)
    workload_of = {zlib.crc32(r.request_id.encode()): r.request_id.split("/")[1] for r in ev_records}
    workload = np.asarray([workload_of[k] for k in s_ev.requests])
    order = np.random.default_rng(0).permutation(len(more))  # which more prompts a share takes
    lines = [f"held out: {len(s_ev)} verdicts of {len(np.unique(s_ev.requests))} workload prompts "
             f"(code, structured, text; never trained on)", "",
             "unchecked share at agreement >= A on the held-out workloads: model / confidence frontier",
             f"{'training set, model, workload':<44}{'drafts':>7}{'log loss':>9}  "
             + "  ".join(f"{x:>11}" for x in AGREEMENTS)]
    for share in SHARES:
        keep = {f"export/{more[i].name}" for i in order[: round(share * len(more))]}
        tr_records = base + [r for r in extra if r.request_id in keep]
        s_tr = collect_samples(tr_records)
        known = ~np.isnan(s_tr.x).any(axis=0) & (s_tr.x.std(axis=0) > 1e-9)
        label = f"20 + {len(keep)} prompts ({len(s_tr)} verdicts)"
        fit = fit_logistic(s_tr.x[:, known], s_tr.disagree)
        preds = {"logistic": scores(fit, s_ev.x[:, known])}
        if share == 1.0:
            preds["mlp"] = fit_mlp(s_tr.x[:, known], s_tr.disagree)(s_ev.x[:, known])
            n_tr, n_ev = next_columns(tr_records), next_columns(ev_records)
            fill = np.nanmean(n_tr[:, :2], axis=0)
            fit = fit_logistic(with_next(s_tr.x[:, known], n_tr, fill), s_tr.disagree)
            preds["logistic+next"] = scores(fit, with_next(s_ev.x[:, known], n_ev, fill))
        for model, p in preds.items():
            for w in (CODE, STRUCTURED, TEXT, None):
                m = np.ones(len(p), bool) if w is None else workload == w
                sub = s_ev.take(m)
                lines.append(f"{label + ', ' + model + ', ' + (w or 'all'):<44}{int(m.sum()):>7}"
                             f"{log_loss(p[m], sub.disagree):>9.4f}  " + "  ".join(frontier_cells(p[m], sub)))
        lines.append("")
    nxt = n_tr[:, 0]  # all 140 prompts (the last share, SHARES[-1] == 1.0)
    lines.append("heavy disagrees with a training draft, by the next draft's confidence (140 prompts):")
    for lo, hi in ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01)):
        m = (nxt >= lo) & (nxt < hi)
        lines.append(f"  next in [{lo:.2f}, {min(hi, 1.0):.2f}]: {int(m.sum()):5d} drafts, "
                     f"{s_tr.disagree[m].mean():.3f}")
    last = np.isnan(nxt)
    lines.append(f"  last draft of its block: {int(last.sum()):5d} drafts, {s_tr.disagree[last].mean():.3f}")
    text = "\n".join(lines) + "\n"
    (a.out / "report.txt").write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
