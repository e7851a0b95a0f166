"""train-router: a learned router from verify logs beats plain confidence where confidence misleads."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from support.fakes import VOCAB, FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, Recorder, run_one
from tokenrouter_backend.cli import main as cli_main
from tokenrouter_backend.core.signals.learned_router import LearnedRouter
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.core.signals.token_classes import TokenClass, VocabClasses
from tokenrouter_backend.learning import router_training as rt
from tokenrouter_backend.operations.decision_log import DecisionLog

TEXTS = [str(i) for i in range(10)] + [f" w{i}" for i in range(VOCAB - 10)]  # ids 0-9 are digits
LAX = ClassPolicy((1.0,) * len(TokenClass))  # no class rule: the router alone must find the digits


def slip(prefix) -> int | None:
    """The digit a third of the positions are about (a hash of the last tokens), else None."""
    key = zlib.crc32(np.asarray(prefix[-3:], np.int64).tobytes())
    return key % 10 if key % 3 == 0 else None


class DigitSlipLM(ToyLM):
    """Light: the heavy ToyLM, except that at slip positions it is sure of the slip digit."""

    def logits(self, prefix) -> np.ndarray:
        z = super().logits(prefix)
        d = slip(prefix)
        if d is not None:
            z[d] = z.max() + 4.0
        return z


class HeavyLM(ToyLM):
    """Heavy: at slip positions the digit is its close second (kept by route, never rolled back)."""

    def logits(self, prefix) -> np.ndarray:
        z = super().logits(prefix)
        d = slip(prefix)
        if d is not None and int(np.argmax(z)) != d:
            z[d] = z.max() - 1.0
        return z


def verify_records(prompts, gate):
    rec = Recorder()
    light, heavy = DigitSlipLM(), HeavyLM()
    for i, prompt in enumerate(prompts):
        run_one(prompt, FakeBranch("light", light), FakeBranch("heavy", heavy), hooks=rec, request_id=f"v{i}",
                router_mode="verify", max_tokens=48, route_gate=gate)
    return rec.records


@pytest.fixture(scope="module")
def records():
    return verify_records(PROMPTS, RouteGate(LAX, VocabClasses.from_texts(TEXTS)))


def test_samples_carry_the_logged_features(records):
    s = rt.collect_samples(records)
    assert len(s) > 500 and 0.1 < s.disagree.mean() < 0.9
    digits = s.classes == TokenClass.NUMBER
    assert s.disagree[digits].mean() > s.disagree[~digits].mean() + 0.3  # the slip is learnable
    train, held = rt.split(s, 0.25, 0)
    assert not set(train.requests) & set(held.requests) and len(train) + len(held) == len(s)


def test_router_beats_the_confidence_frontier_on_held_out_requests(records):
    report = rt.train(records, LAX, confidence_threshold=0.8, holdout=0.25, target_agreement=0.95)
    f = report.frontier
    print("\n" + rt.report_text(report))
    assert report.recall > 0.5 and report.precision > 0.5 and report.recall_half > 0.5
    best = max(f.router, key=lambda p: p.unchecked_share - rt.unchecked_at(f.confidence_fine, p.agreement))
    assert best.unchecked_share > rt.unchecked_at(f.confidence_fine, best.agreement) + 0.05
    chosen = rt.predict_mask(rt.split(rt.collect_samples(records), 0.25, 0)[1].verdicts,
                             report.router.p_disagree(rt.split(rt.collect_samples(records), 0.25, 0)[1].x)
                             <= report.router.threshold, report.router.threshold)
    assert chosen.agreement >= report.target_agreement - 0.03


def test_too_few_verdicts_is_a_clear_error(records):
    with pytest.raises(rt.NotEnoughData, match="collect more verify-mode logs"):
        rt.train(records[:3], LAX, 0.8)


def test_cli_writes_a_file_the_gate_routes_with(records, tmp_path, capsys):
    log_path = tmp_path / "verify.jsonl"
    log = DecisionLog(log_path)
    for r in records:
        log.submit(r)
    log.close()
    out = tmp_path / "router.json"
    rc = cli_main.main(["train-router", str(log_path), "--out", str(out), "--critical", "number=1.0",
                        "--critical", "operator=1.0", "--critical", "logic=1.0", "--critical", "definition=1.0",
                        "--target-agreement", "0.95", "--plot", str(tmp_path / "frontier.png")])
    text = capsys.readouterr().out
    assert rc == 0 and "precision" in text and "confidence frontier" in text
    assert (tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    router = LearnedRouter.load(out)
    assert router.trained["held_out_requests"] > 0
    # routed with the file: digits the light model slips in mostly go to the heavy model
    gate = RouteGate(LAX, VocabClasses.from_texts(TEXTS), router)
    agree_router = route_agreement(gate)
    agree_conf = route_agreement(RouteGate(LAX, VocabClasses.from_texts(TEXTS)))
    assert agree_router > agree_conf + 0.05
    assert cli_main.main(["train-router", str(log_path), "--out", str(out), "--critical", "colour=1"]) == 2
    assert "unknown class" in capsys.readouterr().out


def route_agreement(gate) -> float:
    """Heavy agreement of route outputs (greedy heavy choice given the text before)."""
    from support.ops_helpers import heavy_agreement
    total = agree = 0
    for prompt in PROMPTS[:16]:
        out, _ = run_one(prompt, FakeBranch("light", DigitSlipLM()), FakeBranch("heavy", HeavyLM()),
                         router_mode="route", max_tokens=48, route_gate=gate)
        agree += heavy_agreement(prompt, out, HeavyLM()) * len(out)
        total += len(out)
    return agree / total


def test_separate_evaluation_logs(records):
    train_part = [r for r in records if int(r.request_id[1:]) < 30]
    eval_part = [r for r in records if int(r.request_id[1:]) >= 30]
    report = rt.train(train_part, LAX, 0.8, target_agreement=0.95, held_out=eval_part)
    assert report.held_tokens == len(rt.collect_samples(eval_part))
    assert report.train_tokens == len(rt.collect_samples(train_part))
