"""Logit processors (penalties, logit bias, min_tokens) in the branch engine against a
reference computed from the whole sequence, on extend, check and draft rows; their JSON
contract; and through a real tritonserver (tiny pair): verify token-identical to heavy-only
under the same processors, refusals by name."""
from __future__ import annotations

import numpy as np
import pytest

from support.fixtures_engine import ToyLM
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, op_from_arrays, op_to_arrays
from tokenrouter_backend.core.protocol.logit_processors import LogitProcessors
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig

PROMPT = (3, 4, 5, 9)


def reference_choices(model, seq, start, answer_start, p: LogitProcessors, ends=()):
    """Greedy choices after each position from ``start`` on, processing the full sequence's
    logits by the processors' definition (vLLM's order)."""
    x = np.asarray(seq, dtype=np.int64)[None]
    logits, _ = model.forward(x, np.ones_like(x), np.arange(x.shape[1])[None], model.empty_past(1))
    out = []
    for i in range(start, len(seq)):
        row = logits[0, i].astype(np.float64).copy()
        q = i + 1
        earlier = list(seq[answer_start:q])
        if p.repetition != 1.0:
            for t in set(p.prompt_seen) | set(earlier):
                row[t] = row[t] / p.repetition if row[t] > 0 else row[t] * p.repetition
        for t in set(earlier):
            row[t] -= p.frequency * earlier.count(t) + p.presence
        for t, b in p.bias:
            row[t] += b
        if q - answer_start < p.min_tokens:
            row[list(ends)] = -1e30
        out.append(int(row.argmax()))
    return out


@pytest.mark.parametrize("p", [
    LogitProcessors(frequency=1.5, presence=0.5),
    LogitProcessors(repetition=1.8),
    LogitProcessors(bias=((7, 5.0), (11, -100.0))),
    LogitProcessors(frequency=-2.0, bias=((2, 3.0),)),
])
def test_processed_rows_match_the_definition_on_extend_and_draft_rows(p):
    model = ToyLM()
    eng = BranchEngine(model, config=EngineConfig(), name="heavy")
    start = len(PROMPT)
    p = LogitProcessors(**{**p.__dict__, "answer_start": start, "prompt_seen": tuple(sorted(set(PROMPT)))})
    first = eng.run([BranchOp(1, 0, PROMPT, processors=p)])[0]
    answer = [int(first.tokens[-1])]
    # a check-like step: two answer tokens in (the history is what the session holds), drafting on
    step = eng.run([BranchOp(1, start, (answer[0], 8), draft_len=5, score_last=2,
                             processors=LogitProcessors(**{**p.__dict__, "history": ()}))])[0]
    seq = PROMPT + (answer[0], 8) + tuple(int(t) for t in step.tokens[1:-1])
    ref = reference_choices(model, seq, start, start, p)
    assert [int(first.tokens[-1])] == reference_choices(model, PROMPT, start - 1, start, p)
    assert step.tokens.tolist() == ref


def test_min_tokens_suppresses_the_ends_until_the_answer_is_long_enough():
    model = ToyLM()
    plain = BranchEngine(model, config=EngineConfig(), name="heavy").run(
        [BranchOp(1, 0, PROMPT, draft_len=6, score_last=1)])[0]
    ends = tuple(int(t) for t in plain.tokens[:3])  # tokens the model chooses unprocessed
    p = LogitProcessors(min_tokens=3, ends=ends, answer_start=len(PROMPT))
    res = BranchEngine(model, config=EngineConfig(), name="heavy").run(
        [BranchOp(1, 0, PROMPT, draft_len=6, score_last=1, processors=p)])[0]
    assert not set(res.tokens[:3].tolist()) & set(ends)  # the first three answer positions avoid them
    assert res.tokens.tolist() == reference_choices(model, PROMPT + tuple(int(t) for t in res.tokens[:-1]),
                                                    len(PROMPT) - 1, len(PROMPT), p, ends)


def test_processors_travel_as_checked_json():
    p = LogitProcessors(presence=0.5, frequency=-1.0, repetition=1.2, bias=((5, -100.0),), min_tokens=2, ends=(1,),
                        answer_start=4, prompt_seen=(3, 4), history=(9,))
    op = BranchOp(1, 4, (7,), processors=p)
    assert op_from_arrays(op_to_arrays(op).get).processors == p
    assert "logit_processors" not in op_to_arrays(BranchOp(1, 0, (7,), processors=LogitProcessors()))  # inactive
    for bad, field in (('{"presence": 3}', "presence"), ('{"bias": [[1, 101]]}', "bias"), ('{"ends": [-1]}', "ends"),
                       ('{"repetition": 0}', "repetition"), ("[1]", "object"), ("x", "JSON")):
        with pytest.raises(ValueError, match=field):
            LogitProcessors.from_json(bad)
    eng = BranchEngine(ToyLM(), config=EngineConfig(), name="heavy")
    out = eng.run([BranchOp(1, 0, PROMPT, processors=LogitProcessors(bias=((10 ** 6, 1.0),)))])[0]
    assert isinstance(out, Exception) and "logit_processors holds token" in str(out)


def test_min_p_keeps_the_tokens_within_min_p_of_the_top():
    from tokenrouter_backend.core.loop.sampling import processed_probs
    from tokenrouter_backend.core.protocol.branch_protocol import Sampling

    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    kept = processed_probs(logits, Sampling(temperature=1.0, min_p=0.5))  # 0.3 >= 0.25, 0.15 < 0.25
    np.testing.assert_allclose(kept, [[0.625, 0.375, 0.0, 0.0]], rtol=1e-5)
    assert processed_probs(logits, Sampling(temperature=1.0, min_p=1.0))[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    op = BranchOp(1, 0, (3,), sampling=Sampling(temperature=0.7, seed=3, min_p=0.2))
    assert op_from_arrays(op_to_arrays(op).get).sampling.min_p == pytest.approx(0.2)
