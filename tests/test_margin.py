"""Top-1 minus top-2 margin: engine, branch protocol, decision log, learned router, train-router."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support.fakes import FakeBranch, ToyLM
from support.fixtures_engine import ToyLM as EngineToyLM
from support.ops_helpers import PROMPTS, Recorder, run_one
from tokenrouter_backend.branches.remote import OPTIONAL_OUTPUTS
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.protocol.branch_protocol import (
    TENSOR_OUTPUTS,
    BranchOp,
    BranchResult,
    Sampling,
    result_from_arrays,
    result_to_arrays,
)
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.signals.learned_router import (
    FEATURES,
    REQUEST_STATE_FEATURES,
    LearnedRouter,
    feature_matrix,
)
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteContext, RouteGate
from tokenrouter_backend.core.signals.token_classes import TokenClass
from tokenrouter_backend.engine.branch_engine import BranchEngine
from tokenrouter_backend.engine.step_scores import top_margin
from tokenrouter_backend.learning import router_training as rt
from tokenrouter_backend.operations.decision_log import record_from_dict, record_to_json

OLD_FEATURES = tuple(f for f in FEATURES if f != "margin")  # a router file trained before margin existed


def sorted_margin(dist: np.ndarray) -> np.ndarray:
    top = np.sort(dist, axis=-1)[:, -2:]
    return top[:, 1] - top[:, 0]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=12, top_p=0.9, seed=3)])
def test_engine_margin_is_top1_minus_top2_of_the_processed_distribution(sampling):
    eng = BranchEngine(EngineToyLM(), name="light")
    res = eng.run([BranchOp(1, 0, (3, 4, 5, 6), draft_len=4, sampling=sampling, return_dist=True)])[0]
    assert len(res.margin) == len(res.tokens) == len(res.dist)
    np.testing.assert_allclose(res.margin, sorted_margin(res.dist), atol=1e-5)
    assert np.all(res.margin >= 0) and np.all(res.margin <= res.token_probs.max() + 1e-6)


def test_top_margin_leaves_the_weights_as_they_were_and_handles_ties():
    w = np.array([[1.0, 0.5, 1.0], [0.2, 1.0, 0.1]], np.float32)
    before = w.copy()
    np.testing.assert_allclose(top_margin(w, np.array([0.4, 0.5], np.float32)), [0.0, 0.4])
    np.testing.assert_array_equal(w, before)
    np.testing.assert_allclose(top_margin(np.ones((2, 1), np.float32), np.ones(2, np.float32)), [1.0, 1.0])


def result(margin) -> BranchResult:
    f = np.array([0.5, 0.25], np.float32)
    return BranchResult(np.array([1, 2], np.int32), f, f, np.zeros(1, np.float32), 3, margin=margin)


def test_margin_crosses_the_branch_tensors_and_is_optional():
    arrays = result_to_arrays(result(np.array([0.3, 0.1], np.float32)))
    np.testing.assert_allclose(result_from_arrays(arrays.get).margin, [0.3, 0.1])
    older = {k: v for k, v in arrays.items() if k != TENSOR_OUTPUTS["margin"]}  # a config without the output
    assert result_from_arrays(older.get).margin.shape == (0,)
    assert TENSOR_OUTPUTS["margin"] in OPTIONAL_OUTPUTS


def verify_records(margin: bool = True, n: int = 12):
    rec = Recorder()
    light, heavy = ToyLM(noise=0.8, seed=1), ToyLM()
    for i, prompt in enumerate(PROMPTS[:n]):
        run_one(prompt, FakeBranch("light", light, margin=margin), FakeBranch("heavy", heavy), hooks=rec,
                request_id=f"m{i}", router_mode="verify", max_tokens=40, route_gate=RouteGate())
    return [r for r in rec.records if r.action == Action.VERIFY]


def test_verify_records_carry_the_light_margin_and_older_branches_none():
    records = verify_records()
    assert records and all(len(r.margin) == len(r.drafted) for r in records)
    assert all(0.0 <= m <= c + 1e-4 for r in records for m, c in zip(r.margin, r.confidence))
    assert all(r.margin == () for r in verify_records(margin=False, n=3))


def test_decision_log_keeps_margin_and_reads_lines_without_it():
    record = verify_records(n=2)[0]
    back = record_from_dict(json.loads(record_to_json(record)))
    assert back.margin == record.margin and back.margin
    line = json.loads(record_to_json(record))
    del line["margin"]  # a line written before margin was logged
    assert record_from_dict(line).margin == ()


def hand_router(features, weight_on: dict[str, float]) -> LearnedRouter:
    w = np.array([weight_on.get(f, 0.0) for f in features])
    n = len(features)
    return LearnedRouter(w, 0.0, np.full(n, 0.5), np.ones(n), 0.3, features=tuple(features))


def test_a_router_file_without_margin_loads_and_ignores_it(tmp_path):
    old = hand_router(OLD_FEATURES, {"confidence": -4.0})
    path = tmp_path / "old.json"
    old.save(path)
    d = json.loads(path.read_text())
    assert d["features"] == list(OLD_FEATURES)
    back = LearnedRouter.load(path)
    x = feature_matrix([0.9, 0.4], [0.1, 1.0], [0, 0], [0, 1], 0.6, margin=[0.8, 0.0])
    expected = 1 / (1 + np.exp(4.0 * (np.array([0.9, 0.4]) - 0.5)))
    np.testing.assert_allclose(back.p_disagree(x), expected)
    np.testing.assert_allclose(back.p_disagree(feature_matrix([0.9, 0.4], [0.1, 1.0], [0, 0], [0, 1], 0.6)),
                               expected)  # unknown margin: nothing changes for it


def test_a_router_with_margin_uses_it_and_imputes_the_mean_when_unknown():
    router = hand_router(FEATURES, {"margin": -6.0})
    known = router.p_disagree(feature_matrix([0.9, 0.9], [0.1, 0.1], [0, 0], [3, 3], 0.6, margin=[0.9, 0.1]))
    assert known[0] < 0.1 < 0.9 < known[1]  # same confidence, the margin decides
    unknown = router.p_disagree(feature_matrix([0.9], [0.1], [0], [3], 0.6))
    np.testing.assert_allclose(unknown, [0.5])  # the training mean: contributes nothing
    gate = RouteGate(ClassPolicy((1.0,) * len(TokenClass)), None, router)
    params = RouterDefaults().request_params({"router_mode": "route"})
    d = gate.decide(None, [1, 2], [0.9, 0.9], [0.1, 0.1], 0, params, RouteContext(), frozenset(), margin=[0.9, 0.1])
    assert d.stand == 1 and d.record_fields()["margin"] == (0.9, 0.1)


def test_train_router_uses_margin_when_logged_and_says_so_when_not():
    with_margin = verify_records(n=40)
    report = rt.train(with_margin, ClassPolicy(), 0.8, holdout=0.25, min_tokens=20)
    assert "margin" in report.router.features and not report.notes
    assert "features: " in rt.report_text(report) and "margin" in rt.report_text(report)
    without = verify_records(margin=False, n=40)
    report = rt.train(without, ClassPolicy(), 0.8, holdout=0.25, min_tokens=20)
    assert report.router.features == tuple(f for f in OLD_FEATURES if f not in REQUEST_STATE_FEATURES)
    assert len(report.notes) == 1 and "'margin'" in report.notes[0] and "trained without it" in report.notes[0]
    assert "note: " in rt.report_text(report)
    # the running acceptance is logged but never trained on: it depends on where the heavy checks fell
    assert "acceptance" in FEATURES and "acceptance" not in report.router.features


def test_the_confidence_rule_takes_a_margin_bar_only_when_set():
    gate = RouteGate(ClassPolicy((1.0,) * len(TokenClass)))
    args = (None, [1, 2, 3], [0.9, 0.9, 0.9], [0.1, 0.1, 0.1], 0)
    off = RouterDefaults().request_params({"router_mode": "route"})
    assert off.margin_threshold == 0.0
    assert gate.decide(*args, off, RouteContext(), frozenset(), margin=[0.9, 0.05, 0.9]).stand == 3
    on = RouterDefaults.from_config({"margin_threshold": "0.2"}).request_params({"router_mode": "route"})
    assert gate.decide(*args, on, RouteContext(), frozenset(), margin=[0.9, 0.05, 0.9]).stand == 1
    assert gate.decide(*args, on, RouteContext(), frozenset()).stand == 0  # unknown margin fails a set bar
    with pytest.raises(InvalidRequest, match=r"margin_threshold must be in \[0.0, 1.0\]"):
        RouterDefaults.from_config({"margin_threshold": "1.5"})
