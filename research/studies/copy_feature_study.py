#!/usr/bin/env python
"""Would copy features pay in the learned router? Tested offline on unseen workloads.

    .venv/bin/python research/studies/copy_feature_study.py REPO OUT [--tokens 64]

The candidate features, per drafted token: what the n-gram copy of the text before it says
(the prompt-lookup of ``core/loop/ngram.py``, suffixes of 3 to 5 tokens): ``copy_same`` = the copy
continues with the drafted token, ``copy_other`` = with another token (neither: no earlier
occurrence). Text an answer copies from its prompt or from itself is where the light
model's doubt might mean least: evidence that confidence does not hold.

REPO: an exported repository (``heavy/1``, ``light/1``, ``router/1/tokenizer``). The exported
ONNX branches run in process (the real block loop, as ``export --train-router`` runs them)
in verify mode, drafting at every position (block 4, no n-gram drafts), on

* the exporter's 20 training prompts (``learning/router_prompts.py``): ``OUT/train.jsonl``;
* the code, structured and text benchmark workloads (``bench/workloads.py``, none of them
  trained on): ``OUT/eval.jsonl``.

(Existing files are reused.) Each draft's context is rebuilt from the records (prompt +
the answer before the block), its copy agreement computed, and two logistic regressions are
fitted on the training prompts as ``tokenrouter train-router`` fits them: the router's
features, and those plus the copy features. Both are replayed on the held-out workloads
with the default class policy, per workload and in all, against the confidence-threshold
frontier (thresholds every 0.005): the unchecked share each reaches at equal agreement,
and the held-out log loss. Report: ``OUT/report.txt``.
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np
from common import AGREEMENTS, frontier_cells, log_loss, run, scores, tokenizer_of

from tokenrouter_backend.bench.workloads import CODE, STRUCTURED, TEXT, load_workloads
from tokenrouter_backend.core.loop.ngram import lookup
from tokenrouter_backend.export.router_build import prompt_ids
from tokenrouter_backend.learning.router_prompts import TrainingPrompt, training_prompts
from tokenrouter_backend.learning.router_training import collect_samples, fit_logistic, sampled_drafts
from tokenrouter_backend.operations.decision_log import read_log

MIN_N, MAX_N = 3, 5  # the n-gram drafter's defaults


def copy_columns(records, prompts: dict[str, list[int]]) -> np.ndarray:
    """[samples, 2] (copy_same, copy_other) in ``collect_samples``' order, from rebuilt contexts."""
    answers: dict[str, list[int]] = {}
    rows = []
    for r in records:
        before = answers.get(r.request_id, [])
        answers[r.request_id] = before[: r.output_from] + list(r.output)
        n = sampled_drafts(r)
        if n == 0:
            continue
        seq = prompts[r.request_id] + before[: r.position]
        for j in range(n):
            nxt = lookup(seq + list(r.drafted[:j]), MIN_N, MAX_N, 1)
            rows.append((bool(nxt) and nxt[0] == r.drafted[j], bool(nxt) and nxt[0] != r.drafted[j]))
    return np.asarray(rows, np.float64).reshape(-1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_of(a.repo)
    train_prompts = training_prompts()
    eval_prompts = [TrainingPrompt(p.id, p.text) for p in load_workloads((CODE, STRUCTURED, TEXT))]
    files = {"train": (a.out / "train.jsonl", train_prompts), "eval": (a.out / "eval.jsonl", eval_prompts)}
    for path, prompts in files.values():
        if not path.exists():
            run(a.repo, tokenizer, prompts, a.tokens, path)
    ids = {f"export/{p.name}": prompt_ids(tokenizer, p) for p in train_prompts + eval_prompts}
    data = {}
    for name, (path, _) in files.items():
        records = list(read_log(path))
        s = collect_samples(records)
        data[name] = (s, copy_columns(records, ids), records)
    (s_tr, c_tr, _), (s_ev, c_ev, ev_records) = data["train"], data["eval"]
    known = ~np.isnan(s_tr.x).any(axis=0) & (s_tr.x.std(axis=0) > 1e-9)
    variants = {"router features": (s_tr.x[:, known], s_ev.x[:, known]),
                "router + copy features": (np.hstack([s_tr.x[:, known], c_tr]), np.hstack([s_ev.x[:, known], c_ev]))}
    lines = [f"train: {len(s_tr)} verdicts of {len(np.unique(s_tr.requests))} prompts; held out: {len(s_ev)} "
             f"verdicts of {len(np.unique(s_ev.requests))} workload prompts", ""]
    for name, c, s in (("train", c_tr, s_tr), ("held out", c_ev, s_ev)):
        for label, m in (("copy same", c[:, 0] == 1), ("copy other", c[:, 1] == 1),
                         ("no copy", (c[:, 0] == 0) & (c[:, 1] == 0))):
            lines.append(f"{name:9s} {label:11s} {int(m.sum()):5d} drafts, heavy disagrees {s.disagree[m].mean():.3f}, "
                         f"mean light confidence {s.verdicts.confidence[m].mean():.3f}")
    lines += ["", "unchecked share at agreement >= A on the held-out workloads: router / confidence frontier",
              f"{'features, workload':<36}{'drafts':>6}{'log loss':>9}  " + "  ".join(f"{x:>11}" for x in AGREEMENTS)]
    workload_of = {zlib.crc32(r.request_id.encode()): r.request_id.split("/")[1] for r in ev_records}
    workload = np.asarray([workload_of[k] for k in s_ev.requests])  # the sample's request key -> its workload
    for name, (x_tr, x_ev) in variants.items():
        p = scores(fit_logistic(x_tr, s_tr.disagree), x_ev)
        for w in (CODE, STRUCTURED, TEXT, None):
            m = np.ones(len(p), bool) if w is None else workload == w
            sub = s_ev.take(m)
            lines.append(f"{name + ', ' + (w or 'all'):<36}{int(m.sum()):>6}{log_loss(p[m], sub.disagree):>9.4f}  "
                         + "  ".join(frontier_cells(p[m], sub)))
    text = "\n".join(lines) + "\n"
    (a.out / "report.txt").write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
