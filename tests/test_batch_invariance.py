"""Branch results do not depend on the batch: one session run alone and the same session
inside a padded batch with sessions of other lengths give identical greedy tokens and the
same probabilities (tiny pair, the branches as exported by default, and every light
quantization mode checked against its documented ``BATCH_INVARIANT`` flag)."""
from __future__ import annotations

import numpy as np
import pytest

from tokenrouter_backend.core.branch_protocol import BranchOp
from tokenrouter_backend.engine.branch_engine import BranchEngine
from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM
from tokenrouter_backend.export import quantize
from tokenrouter_backend.export.pipeline import ExportOptions, export_pair

PROB_TOL = 1e-5  # |p_alone - p_batched|; the batch-dependent INT8 modes differ by ~1e-4..1e-3
DRAFT = 8
OTHER_LENGTHS = (3, 17, 6)  # shorter and longer than the session under test (9 tokens)


def _prompts(vocab: int):
    rng = np.random.default_rng(1)
    mine = tuple(int(x) for x in rng.integers(5, vocab, 9))
    others = [tuple(int(x) for x in rng.integers(5, vocab, n)) for n in OTHER_LENGTHS]
    return mine, others


def _two_steps(lm, mine, others, alone: bool):
    """Step 1: prefill + DRAFT greedy drafts; step 2: roll back 3, feed 2, draft 4.

    Returns session 0's two results; with ``alone`` False the other sessions share every
    forward (session 0 sits between them, so it is neither the first nor the last row).
    """
    engine = BranchEngine(lm)
    extra = [] if alone else list(enumerate(others, start=1))
    first = [BranchOp(s, 0, ids, draft_len=DRAFT) for s, ids in extra[:1]]
    first += [BranchOp(0, 0, mine, draft_len=DRAFT)]
    first += [BranchOp(s, 0, ids, draft_len=DRAFT) for s, ids in extra[1:]]
    res1 = engine.run(first)
    r1 = res1[0 if alone else 1]
    keep = r1.session_len - 3
    cont = (int(r1.tokens[-4]), int(r1.tokens[-3]))
    second = [BranchOp(0, keep, cont, draft_len=4)]
    for (s, _), r in zip(extra, [r for i, r in enumerate(res1) if alone or i != 1]):
        second.append(BranchOp(s, r.session_len, (int(r.tokens[-1]),), draft_len=2))
    r2 = engine.run(second)[0]
    return r1, r2


def _differences(model_dir) -> tuple[bool, float]:
    """(greedy tokens identical in both steps, max |prob difference|) alone vs batched."""
    lm = OnnxCausalLM(model_dir)
    mine, others = _prompts(lm.info.vocab_size)
    alone = _two_steps(lm, mine, others, alone=True)
    batched = _two_steps(lm, mine, others, alone=False)
    same, diff = True, 0.0
    for a, b in zip(alone, batched):
        assert a.session_len == b.session_len
        same &= np.array_equal(a.tokens, b.tokens)
        for x, y in ((a.token_probs, b.token_probs), (a.input_probs, b.input_probs)):
            diff = max(diff, float(np.abs(x - y).max(initial=0.0)))
    return same, diff


@pytest.mark.parametrize("branch", ["heavy", "light"])
def test_default_export_is_batch_invariant(tiny_export, branch):
    out, report = tiny_export
    same, diff = _differences(out / branch / "1")
    print(f"{branch} ({report[branch]['precision']}): tokens identical {same}, max prob diff {diff:.3g}")
    assert same, f"{branch}: greedy tokens change when the session shares a padded batch"
    assert diff <= PROB_TOL, f"{branch}: probabilities change by {diff} inside a padded batch"


@pytest.fixture(scope="module")
def light_fp32(tiny_pair, tmp_path_factory):
    """The tiny light model exported FP32 (the input of every quantization mode)."""
    work = tmp_path_factory.mktemp("fp32")
    export_pair(*tiny_pair, work / "repo", ExportOptions(light_quant="none", template=None, work_dir=work,
                                                         skip_validation=True))
    return work / "light"


@pytest.mark.parametrize("mode", quantize.QUANT_MODES)
def test_quant_modes_match_their_batch_invariance_flag(light_fp32, tmp_path, mode):
    """The flag export.json reports (and the docs repeat) is what the model does."""
    quantize.quantize_light(light_fp32, tmp_path / mode, mode)
    same, diff = _differences(tmp_path / mode)
    print(f"{mode}: tokens identical {same}, max prob diff {diff:.3g}")
    if quantize.BATCH_INVARIANT[mode]:
        assert same and diff <= PROB_TOL, (same, diff)
    else:
        assert diff > PROB_TOL, f"{mode} is documented batch-dependent but matched to {diff}"
