"""train-router --labels outcome: whitespace-only variants of heavy's token are not positives."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from tokenizers import Tokenizer, models

from support.fakes import VOCAB, FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, Recorder, run_one
from tokenrouter_backend.cli import main as cli_main
from tokenrouter_backend.core.loop.hooks import Action, BlockRecord
from tokenrouter_backend.core.signals.learned_router import LearnedRouter
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.learning import router_training as rt
from tokenrouter_backend.learning.outcome_labels import formatting_only, heavy_choice, outcome_disagree
from tokenrouter_backend.operations.decision_log import DecisionLog

# ids 2j and 2j+1 are the same word with and without a leading space
TEXTS = [(" " if t % 2 == 0 else "") + f"w{t // 2}" for t in range(VOCAB)]


def twin_position(prefix) -> bool:
    return zlib.crc32(np.asarray(prefix[-2:], np.int64).tobytes()) % 4 == 0


class TwinLM(ToyLM):
    """Light: the heavy ToyLM, except that at a quarter of the positions it is sure of the
    whitespace twin of heavy's choice (a formatting-only slip)."""

    def logits(self, prefix) -> np.ndarray:
        z = super().logits(prefix)
        if twin_position(prefix):
            z[int(np.argmax(z)) ^ 1] = z.max() + 3.0
        return z


class NoisyTwinLM(TwinLM):
    def __init__(self):
        super().__init__(noise=0.7, seed=4)


def verify_run(n: int = 40):
    rec, answers = Recorder(), {}
    light, heavy = NoisyTwinLM(), ToyLM()
    for i, prompt in enumerate(PROMPTS[:n]):
        out, _ = run_one(prompt, FakeBranch("light", light), FakeBranch("heavy", heavy), hooks=rec,
                         request_id=f"o{i}", router_mode="verify", max_tokens=40, route_gate=RouteGate())
        answers[f"o{i}"] = (tuple(prompt), out)
    return [r for r in rec.records if r.action == Action.VERIFY], answers


@pytest.fixture(scope="module")
def run():
    return verify_run()


def test_formatting_only_and_the_heavy_choice_from_the_log():
    assert formatting_only(" x", "x") and formatting_only("\n    ", " ") and formatting_only("a b", "ab")
    assert not formatting_only("x", "y") and not formatting_only(" x", "X")
    r = BlockRecord("r", 5, "verify", Action.VERIFY, 3, (2, 4, 6), (0.9,) * 3, (0.1,) * 3, 1, (True, False),
                    (0.9, 0.1), 0, 1, 0.0, 0.0, 0.0, 0.0, 2, output_from=5, output=(2, 5))
    assert heavy_choice(r, 1) == 5 and heavy_choice(r, 2) is None
    assert outcome_disagree(r, 2, TEXTS).tolist() == [False, False]  # 4 = " w2", 5 = "w2": same outcome
    assert outcome_disagree(r, 2, TEXTS[:5]).tolist() == [False, True]  # unknown text: still a positive
    assert outcome_disagree(BlockRecord(**{**r.__dict__, "output": (2,)}), 2, TEXTS).tolist() == [False, True]


def test_outcome_labels_drop_exactly_the_whitespace_twins(run):
    records, answers = run
    heavy = ToyLM()
    twins = token = 0
    for r in records:  # heavy's choice recomputed from the model, not read from the log
        prompt, out = answers[r.request_id]
        for i, agree in enumerate(r.heavy_agree):
            if agree:
                continue
            token += 1
            choice = int(np.argmax(heavy.logits(list(prompt) + list(out[: r.position + i]))))
            twins += choice == int(r.drafted[i]) ^ 1
    assert token > 50 and twins > 10  # the run has both kinds of disagreement
    assert int(rt.collect_samples(records).disagree.sum()) == token
    assert int(rt.collect_samples(records, TEXTS).disagree.sum()) == token - twins


def test_train_with_outcome_labels_reports_them(run):
    records, _ = run
    report = rt.train(records, ClassPolicy(), 0.8, holdout=0.25, texts=TEXTS)
    text = rt.report_text(report)
    assert report.router.trained["labels"] == "outcome" and "'heavy would change the outcome'" in text
    assert "whitespace-only variants" in text
    assert 0.0 <= report.precision <= 1.0 and 0.0 <= report.recall <= 1.0
    token = rt.train(records, ClassPolicy(), 0.8, holdout=0.25)
    assert token.router.trained["labels"] == "token" and "'heavy would disagree'" in rt.report_text(token)


def test_cli_labels_outcome_needs_a_tokenizer_and_reads_one(run, tmp_path, capsys):
    records, _ = run
    log_path = tmp_path / "verify.jsonl"
    log = DecisionLog(log_path)
    for r in records:
        log.submit(r)
    log.close()
    out = tmp_path / "router.json"
    assert cli_main.main(["train-router", str(log_path), "--out", str(out), "--labels", "outcome"]) == 2
    assert "--labels outcome needs --tokenizer" in capsys.readouterr().out
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TEXTS)}, unk_token=None))
    tok.save(str(tmp_path / "tokenizer.json"))
    rc = cli_main.main(["train-router", str(log_path), "--out", str(out), "--labels", "outcome",
                        "--tokenizer", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 0 and "whitespace-only variants" in printed
    assert LearnedRouter.load(out).trained["labels"] == "outcome"
    assert cli_main.main(["train-router", str(log_path), "--out", str(out), "--labels", "outcome",
                          "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "--tokenizer: no tokenizer.json" in capsys.readouterr().out
