"""Built-in export validation: ONNX (run by ``OnnxCausalLM``) vs transformers logits.

Four checks on a fixed code prompt, teacher-forced so every ONNX position has a reference:
  prefill  one sequence, all prompt tokens in one call
  decode   the same sequence continued by DECODE_STEPS single-token calls feeding KV back
  batch    two prompts of different lengths: a right-padded batched prefill, then one step
           whose past is LEFT-padded and whose new tokens are right-padded (as the engine does)
  scored   a batched prefill asking logits for some positions only (``logits_positions``:
           the last 3 of one row, the last one, repeated, of the other), as a verify and a
           prefill ask for them
FP32/FP16 must stay within a bound relative to the logit scale; INT8 must keep a top-1
agreement floor. A failing check raises ``ValidationError`` with the numbers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

VALIDATION_TEXT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n"
)
SECOND_TEXT = "import os\nimport sys\n\nfor name in sorted(os.listdir(sys.argv[1])):\n    print(name)\n"
MAX_PROMPT_TOKENS = 64
DECODE_STEPS = 4
FP32_REL_TOL = 1e-3  # max |onnx - ref| <= this * max |ref|
FP16_REL_TOL = 2e-2
INT8_MIN_AGREEMENT = 0.75  # top-1 agreement floor vs the FP32 transformers model


class ValidationError(RuntimeError):
    """An exported model disagrees with transformers beyond the bound (message has the numbers)."""


@dataclass
class ValidationReport:
    precision: str
    max_abs_diff: float
    logit_scale: float
    tolerance: float | None
    top1_agreement: float
    positions: int
    min_agreement: float | None
    per_check: dict = field(default_factory=dict)
    passed: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The two fixed prompts as token ids (the first one longer)."""
    a = tokenizer(VALIDATION_TEXT)["input_ids"][:MAX_PROMPT_TOKENS]
    b = tokenizer(SECOND_TEXT)["input_ids"][:MAX_PROMPT_TOKENS]
    if len(b) >= len(a):
        b = b[: max(len(a) // 2, 2)]
    return a, b


def reference_logits(model, prompts: list[list[int]]) -> list[np.ndarray]:
    """transformers logits [len, V] (float32) for each prompt as one unpadded sequence."""
    import torch

    refs = []
    with torch.no_grad():
        for ids in prompts:
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
            refs.append(out.logits[0].float().numpy())
    return refs


def _concat_kv(past, new):
    return [(np.concatenate([pk, nk], axis=2), np.concatenate([pv, nv], axis=2))
            for (pk, pv), (nk, nv) in zip(past, new)]


def batch_step(lm, pasts, news, start_positions):
    """One batched forward: pasts left-padded to the longest, news right-padded.

    pasts: per row, per layer (k, v) [1, h, P_i, d]; news: per row token lists;
    start_positions: per row position of its first new token (= P_i). Returns per row
    (logits [n_i, V], per-layer new (k, v) [1, h, n_i, d] of its real tokens).
    """
    b = len(news)
    p_max = max(p[0][0].shape[2] for p in pasts)
    s_max = max(len(n) for n in news)
    ids = np.zeros((b, s_max), dtype=np.int64)
    pos = np.zeros((b, s_max), dtype=np.int64)
    mask = np.zeros((b, p_max + s_max), dtype=np.int64)
    for r, (past, new, start) in enumerate(zip(pasts, news, start_positions)):
        p = past[0][0].shape[2]
        ids[r, : len(new)] = new
        pos[r] = start + np.arange(s_max)  # padded tail: continuing positions, masked anyway
        mask[r, p_max - p : p_max] = 1
        mask[r, p_max : p_max + len(new)] = 1
    flat_past = []
    for layer in range(lm.info.num_layers):
        ks, vs = [], []
        for past in pasts:
            k, v = past[layer]
            pad = [(0, 0), (0, 0), (p_max - k.shape[2], 0), (0, 0)]
            ks.append(np.pad(k, pad))
            vs.append(np.pad(v, pad))
        flat_past.append((np.concatenate(ks), np.concatenate(vs)))
    logits, new_kv = lm.forward(ids, mask, pos, flat_past)
    rows = []
    for r, new in enumerate(news):
        n = len(new)
        rows.append((logits[r, :n], [(k[r : r + 1, :, :n], v[r : r + 1, :, :n]) for k, v in new_kv]))
    return rows


def run_checks(lm, prompts) -> dict[str, list[tuple[np.ndarray, int, int]]]:
    """ONNX logits per check as (logits, prompt index, first position)."""
    a, b = prompts
    empty = lm.empty_past(1)
    split = len(a) - DECODE_STEPS
    checks = {"prefill": [], "decode": [], "batch": []}
    (logits, kv), = batch_step(lm, [empty], [a], [0])
    checks["prefill"].append((logits, 0, 0))
    (logits, kv), = batch_step(lm, [empty], [a[:split]], [0])
    for t in range(split, len(a)):
        (step_logits, new), = batch_step(lm, [kv], [[a[t]]], [t])
        checks["decode"].append((step_logits, 0, t))
        kv = _concat_kv(kv, new)
    a1, b1 = len(a) - 3, len(b) - 1  # different past lengths, then 2 vs 1 new tokens
    rows = batch_step(lm, [empty, empty], [a[:a1], b[:b1]], [0, 0])
    checks["batch"] += [(rows[0][0], 0, 0), (rows[1][0], 1, 0)]
    rows = batch_step(lm, [rows[0][1], rows[1][1]], [a[a1 : a1 + 2], b[b1:]], [a1, b1])
    checks["batch"] += [(rows[0][0], 0, a1), (rows[1][0], 1, b1)]
    checks["scored"] = scored_check(lm, a, b)
    return checks


def scored_check(lm, a, b) -> list[tuple[np.ndarray, int, int]]:
    """Right-padded prefill of a and b with logits for a's last 3 and b's last position only."""
    s_max = max(len(a), len(b))
    ids = np.zeros((2, s_max), dtype=np.int64)
    mask = np.zeros((2, s_max), dtype=np.int64)
    for r, row in enumerate((a, b)):
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    pos = np.broadcast_to(np.arange(s_max), (2, s_max))
    wanted = np.array([[len(a) - 3, len(a) - 2, len(a) - 1], [len(b) - 1] * 3], dtype=np.int64)
    logits, _ = lm.forward(ids, mask, pos, lm.empty_past(2), wanted)
    return [(logits[0], 0, len(a) - 3), (logits[1, :1], 1, len(b) - 1)]


def compare(checks, refs) -> dict:
    """Per check: max abs diff, top-1 agreement, positions."""
    out = {}
    for name, items in checks.items():
        diffs, agree, n = [], 0, 0
        for logits, idx, start in items:
            ref = refs[idx][start : start + len(logits)]
            diffs.append(float(np.abs(logits - ref).max()))
            agree += int((logits.argmax(-1) == ref.argmax(-1)).sum())
            n += len(logits)
        out[name] = {"max_abs_diff": max(diffs), "top1_agreement": agree / n, "positions": n}
    return out


def validate_onnx(model_dir, refs, prompts, precision: str, device: str = "cpu",
                  check: bool = True) -> ValidationReport:
    """Run the checks on an exported directory against reference logits.

    check: raise ValidationError when the bound/floor is missed (else only report it).
    """
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM

    lm = OnnxCausalLM(model_dir, device=device)
    per_check = compare(run_checks(lm, prompts), refs)
    scale = float(max(np.abs(r).max() for r in refs))
    positions = sum(c["positions"] for c in per_check.values())
    agreement = sum(c["top1_agreement"] * c["positions"] for c in per_check.values()) / positions
    max_diff = max(c["max_abs_diff"] for c in per_check.values())
    is_int8 = precision.startswith(("int8", "int4"))  # quantized: judged by agreement
    tol = None if is_int8 else (FP16_REL_TOL if precision == "fp16" else FP32_REL_TOL) * max(scale, 1.0)
    report = ValidationReport(
        precision=precision, max_abs_diff=max_diff, logit_scale=scale, tolerance=tol,
        top1_agreement=agreement, positions=positions,
        min_agreement=INT8_MIN_AGREEMENT if is_int8 else None, per_check=per_check,
    )
    report.passed = agreement >= INT8_MIN_AGREEMENT if is_int8 else max_diff <= tol
    if check and not report.passed:
        raise ValidationError(f"validation of {model_dir} ({precision}) failed: {report.to_dict()}")
    return report


def validate_torch(model_dir, refs, prompts, precision: str, device: str = "cpu",
                   check: bool = True) -> ValidationReport:
    """Torch runtime: each prompt's prefill logits from the saved HF folder vs the references.

    Catches weights saved or loaded wrongly; padding and KV handling are transformers' own.
    """
    from tokenrouter_backend.engine.torch_lm import TorchCausalLM

    lm = TorchCausalLM(model_dir, device=device, dtype="float16" if precision == "fp16" else "float32")
    diffs, agree, positions = [], 0, 0
    for ids, ref in zip(prompts, refs):
        n = len(ids)
        logits, _ = lm.forward(np.array([ids]), np.ones((1, n), np.int64), np.arange(n)[None], lm.empty_past(1))
        diffs.append(float(np.abs(logits[0] - ref).max()))
        agree += int((logits[0].argmax(-1) == ref.argmax(-1)).sum())
        positions += n
    scale = float(max(np.abs(r).max() for r in refs))
    tol = (FP16_REL_TOL if precision == "fp16" else FP32_REL_TOL) * max(scale, 1.0)
    per_check = {"prefill": {"max_abs_diff": max(diffs), "top1_agreement": agree / positions, "positions": positions}}
    report = ValidationReport(precision=precision, max_abs_diff=max(diffs), logit_scale=scale, tolerance=tol,
                              top1_agreement=agree / positions, positions=positions, min_agreement=None,
                              per_check=per_check)
    report.passed = report.max_abs_diff <= tol
    if check and not report.passed:
        raise ValidationError(f"validation of {model_dir} ({precision}, torch) failed: {report.to_dict()}")
    return report
