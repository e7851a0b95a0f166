"""What the router studies share: verify-mode records collected in process, the logistic
scorer, the frontier cells and log loss of a report, and the light model's hidden states.

Each study in this folder imports only this module (and the package); run a study from the
repository root as ``.venv/bin/python research/studies/NAME.py --help``.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tokenrouter_backend.core.signals.route_gate import ClassPolicy
from tokenrouter_backend.export.router_build import RouterBuildOptions, collect_records, prompt_ids, vocab_classes
from tokenrouter_backend.learning.replay import predict_mask
from tokenrouter_backend.learning.router_prompts import TrainingPrompt, training_prompts
from tokenrouter_backend.learning.router_training import FINE_GRID, sampled_drafts, unchecked_at
from tokenrouter_backend.operations.decision_log import record_to_json

AGREEMENTS = (1.0, 0.995, 0.99, 0.985, 0.98, 0.97, 0.95)
RECORDS_DIR = Path(__file__).resolve().parents[1] / "records"  # research/records: the studies' run records


def tokenizer_of(repo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(repo / "router" / "1" / "tokenizer")


def stop_token_ids(repo: Path) -> list[int]:
    """The document-end ids besides eos the exporter wrote (preprocessing ``stop_token_ids``)."""
    text = (repo / "preprocessing" / "config.pbtxt").read_text(encoding="utf-8")
    m = re.search(r'key: "stop_token_ids" value: \{ string_value: "([^"]*)"', text)
    return [int(t) for t in (m.group(1) if m else "").split(",") if t.strip()]


def run(repo: Path, tokenizer, prompts: list[TrainingPrompt], tokens: int, out: Path) -> None:
    """Verify-mode records of ``prompts`` on the exported branches in process, into ``out``."""
    from tokenrouter_backend.branches.local_pair import LocalPair
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM

    pair = LocalPair.of(OnnxCausalLM(repo / "light" / "1"), OnnxCausalLM(repo / "heavy" / "1"))
    tok_json = repo / "router" / "1" / "tokenizer" / "tokenizer.json"
    records = collect_records(pair, tokenizer, vocab_classes(tok_json), stop_token_ids(repo),
                              RouterBuildOptions(max_tokens=tokens), prompts)
    out.write_text("".join(record_to_json(r) + "\n" for r in records), encoding="utf-8")


def scores(fit, x: np.ndarray) -> np.ndarray:
    w, b, mean, scale = fit
    return 1 / (1 + np.exp(-np.clip(((x - mean) / scale) @ w + b, -40, 40)))


def frontier_cells(p: np.ndarray, s) -> list[str]:
    v, scale = s.verdicts, ClassPolicy().array()[s.classes]
    allowed = np.isfinite(scale)
    conf = [predict_mask(v, v.confidence >= t, t) for t in FINE_GRID]
    with np.errstate(divide="ignore", invalid="ignore"):
        routed = [predict_mask(v, allowed & (p <= t / scale), float(t))
                  for t in np.unique(np.quantile(p, np.linspace(0, 1, 201)))]
    return [f"{unchecked_at(routed, a):.3f}/{unchecked_at(conf, a):.3f}" for a in AGREEMENTS]


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (~y) * np.log(1 - p)))


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
