"""Conservative start widens only on evidence; dynamic thresholds even out heavy share."""
from __future__ import annotations

import numpy as np
from test_load_control import serve

from support.fakes import FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, heavy_agreement, run_one
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.operations.admission import Operations, RequestInfo

ROUTE = RouterDefaults(mode="route", confidence_threshold=0.7)


def test_conservative_start_widens_step_by_step_on_agreement(capsys):
    light, heavy = FakeBranch("light", ToyLM(seed=2, noise=0.15, scale=6)), FakeBranch("heavy", ToyLM(scale=6))
    ops = Operations({"conservative_start": "true", "conservative_min_samples": "40",
                      "conservative_max_disagreement": "0.1"}, ROUTE)
    assert ops.conservative.threshold == 0.99
    trail, shares = [ops.conservative.threshold], []
    for round_ in range(8):
        share, _, _, _ = serve(ops, PROMPTS[round_ * 5:(round_ + 1) * 5], light, heavy, router_mode="route",
                               confidence_threshold=0.7)
        trail.append(ops.conservative.threshold)
        shares.append(share)
    with capsys.disabled():
        print("\nconservative start thresholds:", [round(t, 2) for t in trail], "light share per round:",
              [round(s, 3) for s in shares])
    assert trail == sorted(trail, reverse=True) and trail[-1] < 0.99 and trail[-1] >= 0.7
    assert shares[-1] > shares[0]


def test_conservative_start_holds_when_light_disagrees():
    light, heavy = FakeBranch("light", ToyLM(seed=9, noise=4.0)), FakeBranch("heavy", ToyLM())
    ops = Operations({"conservative_start": "true", "conservative_min_samples": "40"}, ROUTE)
    for r in range(4):
        serve(ops, PROMPTS[r * 6:(r + 1) * 6], light, heavy, router_mode="route", confidence_threshold=0.7)
    assert ops.conservative.threshold > 0.9


def test_dynamic_threshold_lowers_heavy_calls(capsys):
    """Two kinds of text: one where light is sure, one where it is not; q = 0.3."""
    heavy_lm = ToyLM()
    easy, hard = ToyLM(seed=2, noise=0.3, scale=6.0), ToyLM(seed=2, noise=0.3, scale=1.5)
    results = {}
    for label, quantile in (("static", None), ("dynamic", 0.3)):
        ops = Operations({}, ROUTE)
        shares, agree = [], []
        for lm in (easy, hard):
            for prompt in PROMPTS[:10]:
                adm = ops.admit(RequestInfo("r", prompt, True, dynamic_quantile=quantile),
                                ROUTE.request_params({"router_mode": "route", "max_tokens": 40}))
                light = FakeBranch("light", lm)
                out, stats = run_one(prompt, light, FakeBranch("heavy", heavy_lm), hooks=adm.hooks,
                                     router_mode="route", max_tokens=40)
                # how much of the text needed the heavy model: heavy calls per generated token
                shares.append(stats.heavy_calls / stats.generated_tokens)
                agree.append(heavy_agreement(prompt, out, heavy_lm))
        results[label] = (np.mean(shares[:10]), np.mean(shares[10:]), np.mean(agree))
    with capsys.disabled():
        for k, (e, h, a) in results.items():
            print(f"\n{k}: heavy calls/token easy-text {e:.3f}, hard-text {h:.3f}; agreement {a:.3f}", end="")
        print()
    # the request's own confidence quantile lowers the bar where light is never very sure:
    # fewer heavy calls on both kinds of text, paid for with some agreement
    assert results["dynamic"][1] < results["static"][1] and results["dynamic"][0] < results["static"][0]
    assert results["dynamic"][2] >= 0.9
