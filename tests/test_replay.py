"""Replay: route predictions from a verify-mode log vs real route runs on the same prompts."""
from __future__ import annotations

import numpy as np

from support.fakes import FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, Recorder, heavy_agreement, run_one
from tokenrouter_backend.cli import replay as replay_cli
from tokenrouter_backend.learning import replay
from tokenrouter_backend.operations.decision_log import DecisionLog, read_log

THRESHOLDS = (0.5, 0.7, 0.9)


def pair():
    return FakeBranch("light", ToyLM(seed=5, noise=0.8)), FakeBranch("heavy", ToyLM())


def verify_log(tmp_path):
    rec = Recorder()
    for i, prompt in enumerate(PROMPTS):
        run_one(prompt, *pair(), hooks=rec, request_id=f"v{i}", router_mode="verify", max_tokens=48,
                ngram_drafts=False)  # replay predicts light routing: n-gram blocks are not in it
    path = tmp_path / "verify.jsonl"
    log = DecisionLog(path)
    for r in rec.records:
        log.submit(r)
    log.close()
    return path


def real_route(threshold):
    light_tokens = total = 0
    agreements = []
    for prompt in PROMPTS:
        out, stats = run_one(prompt, *pair(), router_mode="route", confidence_threshold=threshold, max_tokens=48,
                             ngram_drafts=False, heavy_first=False)
        light_tokens += stats.light_tokens
        total += stats.generated_tokens
        agreements.append(heavy_agreement(prompt, out, ToyLM()) * len(out))
    return light_tokens / total, sum(agreements) / total


def test_replay_predicts_route(tmp_path, capsys):
    path = verify_log(tmp_path)
    v = replay.collect(read_log(path))
    assert len(v) > 500
    rows = []
    for t in THRESHOLDS:
        p = replay.predict(v, t)
        share, agree = real_route(t)
        rows.append((t, p.light_share, share, p.agreement, agree))
    with capsys.disabled():
        print("\nthreshold  pred_light  real_light  pred_agree  real_agree")
        for row in rows:
            print("  %.2f      %.3f       %.3f       %.3f       %.3f" % row)
    for t, pl, rl, pa, ra in rows:
        assert abs(pl - rl) < 0.08, f"light share at {t}: predicted {pl:.3f}, real {rl:.3f}"
        assert abs(pa - ra) < 0.05, f"agreement at {t}: predicted {pa:.3f}, real {ra:.3f}"
    # monotone in the threshold: stricter -> less light, more agreement
    preds = [replay.predict(v, t) for t in THRESHOLDS]
    assert preds[0].light_share > preds[-1].light_share and preds[0].agreement <= preds[-1].agreement


def test_cli_prints_grid_and_refuses_non_verify_logs(tmp_path, capsys):
    path = verify_log(tmp_path)
    parser = __import__("argparse").ArgumentParser()
    replay_cli.add_arguments(parser)
    assert replay_cli.run(parser.parse_args([str(path), "--thresholds", "0.5,0.9"])) == 0
    out = capsys.readouterr().out
    assert "light_share" in out and "0.500" in out and "0.900" in out
    rec = Recorder()
    run_one(PROMPTS[0], *pair(), hooks=rec, router_mode="route")
    route_log = tmp_path / "route.jsonl"
    log = DecisionLog(route_log)
    for r in rec.records:
        log.submit(r)
    log.close()
    assert replay_cli.run(parser.parse_args([str(route_log)])) == 1
    assert replay_cli.run(parser.parse_args([str(path), "--thresholds", "x"])) == 2


def test_predict_edges():
    v = replay.Verdicts(np.array([0.95, 0.6, 0.3]), np.zeros(3), np.array([True, False, False]),
                        np.array([0.9, 0.01, 0.2]))
    p = replay.predict(v, 0.5)
    # 0.95 light ok; 0.6 light wrong but rolled back (0.01 < 0.05); 0.3 heavy
    assert p.light_share == 1 / 3 and p.agreement == 1.0 and p.rollback_rate == 1 / 3
    p = replay.predict(v, 0.5, rollback_threshold=0.0)
    assert p.light_share == 2 / 3 and abs(p.agreement - 2 / 3) < 1e-9
