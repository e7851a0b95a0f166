"""Load-adaptive routing driven by a slowed heavy branch and by a light that stops agreeing."""
from __future__ import annotations

import asyncio

from support.fakes import FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, run_one
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.hooks import BlockRecord
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.load_control import LoadConfig, LoadController

LOAD = {"load_control": "true", "load_queue_high_ms": "4", "load_queue_low_ms": "2", "load_min_observations": "10"}


class SlowBranch(FakeBranch):
    """A fake branch whose calls wait ``delay_ms`` before running (queueing, not compute)."""

    delay_ms = 0.0

    async def step(self, op):
        if self.delay_ms and not op.release:
            await asyncio.sleep(self.delay_ms / 1e3)
        return await super().step(op)


def serve(ops, prompts, light, heavy, **given):
    """Requests one after another through admission + hooks; totals per branch."""
    totals = {"tokens": 0, "light_tokens": 0, "heavy_calls": 0, "light_calls": 0}
    outputs = []
    for i, prompt in enumerate(prompts):
        params = RouterDefaults().request_params({"max_tokens": 32, **given})
        adm = ops.admit(RequestInfo(f"r{i}", prompt, explicit_mode=True), params)
        out = []
        stats = asyncio.run(generate(GenerationRequest(prompt, adm.params), light, heavy,
                                     lambda t, s, f, out=out: out.extend(t), hooks=adm.hooks))
        outputs.append(out)
        totals["tokens"] += stats.generated_tokens
        totals["light_tokens"] += stats.light_tokens
        totals["heavy_calls"] += stats.heavy_calls
        totals["light_calls"] += stats.light_calls
    share = totals["light_tokens"] / totals["tokens"]
    return share, totals["heavy_calls"] / totals["tokens"], totals["light_calls"] / totals["tokens"], outputs


def test_route_relieves_saturated_heavy_and_returns(capsys):
    light, heavy = FakeBranch("light", ToyLM(seed=2, noise=0.8)), SlowBranch("heavy", ToyLM())
    route = {"router_mode": "route", "confidence_threshold": 0.8}
    ops_off = Operations({}, RouterDefaults())
    heavy.delay_ms = 8.0
    base_share, base_hpt, _, _ = serve(ops_off, PROMPTS[:12], light, heavy, **route)
    ops = Operations(LOAD, RouterDefaults())
    serve(ops, PROMPTS[:2], light, heavy, **route)  # warm the EWMA
    assert ops.load.saturated and ops.load.queue_ms > 4
    slow_share, slow_hpt, _, _ = serve(ops, PROMPTS[:12], light, heavy, **route)
    heavy.delay_ms = 0.0
    serve(ops, PROMPTS[12:14], light, heavy, **route)  # pressure gone
    assert not ops.load.saturated
    back_share, back_hpt, _, _ = serve(ops, PROMPTS[:12], light, heavy, **route)
    with capsys.disabled():
        print(f"\nroute, heavy +8 ms queue: light share {base_share:.3f} -> {slow_share:.3f} (heavy calls/token "
              f"{base_hpt:.3f} -> {slow_hpt:.3f}); pressure gone: {back_share:.3f} ({back_hpt:.3f})")
    assert slow_share > base_share + 0.05 and slow_hpt < base_hpt
    # relief lifted: the threshold is the request's again (the acceptance-driven block cap
    # still applies, so the share need not be bit-identical to the uncontrolled run)
    params = RouterDefaults().request_params({"max_tokens": 32, **route})
    assert ops.load.plan(params, params.block_size).params.confidence_threshold == 0.8
    assert abs(back_share - base_share) < 0.05 and back_hpt > slow_hpt


def test_verify_stops_drafting_when_acceptance_collapses_and_resumes(capsys):
    good, bad = ToyLM(seed=2, noise=0.3), ToyLM(seed=9, noise=6.0)
    light, heavy = FakeBranch("light", good), FakeBranch("heavy", ToyLM())
    ops = Operations(LOAD, RouterDefaults())
    verify = {"router_mode": "verify", "block_size": 6}
    s_good, h_good, l_good, _ = serve(ops, PROMPTS[:8], light, heavy, **verify)
    assert not ops.load.suspended
    acc_good = ops.load.acceptance
    light.lm = bad
    ops_off = Operations({}, RouterDefaults())
    _, h_bad_off, l_bad_off, _ = serve(ops_off, PROMPTS[8:20], light, heavy, **verify)
    _, h_bad, l_bad, outs = serve(ops, PROMPTS[8:20], light, heavy, **verify)
    acc_bad = ops.load.acceptance
    assert ops.load.suspended and acc_bad < 0.3
    # still lossless: identical to heavy-only greedy
    ref = [run_one(p, FakeBranch("l", good), FakeBranch("h", ToyLM()), router_mode="heavy")[0] for p in PROMPTS[8:20]]
    assert outs == ref
    light.lm = good
    serve(ops, PROMPTS[20:40], light, heavy, **verify)  # probes see the light agree again
    assert not ops.load.suspended, (ops.load.acceptance, ops.load.successes, ops.load.failures)
    _, h_back, l_back, _ = serve(ops, PROMPTS[:8], light, heavy, **verify)
    with capsys.disabled():
        print(f"\nverify, acceptance {acc_good:.2f} -> {acc_bad:.2f}: light calls/token "
              f"{l_bad_off:.3f} (no control) vs {l_bad:.3f} (control), "
              f"heavy calls/token {h_bad_off:.3f} vs {h_bad:.3f};"
              f" recovered: light {l_back:.3f} heavy {h_back:.3f} (before: {l_good:.3f} {h_good:.3f})")
    assert l_bad < 0.5 * l_bad_off and h_bad <= h_bad_off + 0.05
    assert abs(h_back - h_good) < 0.05


def _record(agree, heavy_ms=0.0, fwd=0.0, calls=1):
    return BlockRecord("r", 0, "verify", "verify", 4, (1,) * len(agree), (0.9,) * len(agree), (0.1,) * len(agree),
                       0, tuple(agree), (0.5,) * len(agree), 0, calls, heavy_ms, fwd, 0.0, 0.0, 1)


def test_block_cap_follows_acceptance_and_is_bounded():
    c = LoadController(LoadConfig(control=True, min_observations=5))
    assert c.block_cap(16) == 16  # no evidence: no cap
    for _ in range(30):
        c.observe(_record([True, False]))  # a = 0.5
    assert abs(c.acceptance - 0.5) < 1e-9 and c.block_cap(16) == 2
    for _ in range(200):
        c.observe(_record([True] * 9 + [False]))  # a = 0.9
    assert 9 <= c.block_cap(16) <= 11 and c.block_cap(4) == 4
    for _ in range(200):
        c.observe(_record([False]))
    assert c.block_cap(16) == 1 and c.suspended
    params = RouterDefaults().request_params({"router_mode": "verify"})
    modes = [c.plan(params, 5).mode for _ in range(16)]
    assert modes.count("verify") == 2 and modes[7] == modes[15] == "verify"  # probe_every = 8


def test_queue_hysteresis():
    c = LoadController(LoadConfig(control=True, queue_high_ms=50, queue_low_ms=20, ewma_alpha=1.0))
    c.observe(_record([], heavy_ms=70, fwd=10))
    assert c.saturated and c.queue_ms == 60
    c.observe(_record([], heavy_ms=40, fwd=10))
    assert c.saturated  # 30 ms: between low and high, stays
    c.observe(_record([], heavy_ms=25, fwd=10))
    assert not c.saturated
    route = RouterDefaults().request_params({"router_mode": "route", "confidence_threshold": 0.6})
    c.observe(_record([], heavy_ms=100))
    assert c.plan(route, 5).params.confidence_threshold == 0.5  # floor, not 0.4
