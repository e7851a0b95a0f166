"""Cost-model speculation: fitted curves and the draft length they choose."""
import asyncio
import dataclasses

import numpy as np
import pytest

from support.fakes import FakeBranch, ToyLM
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp
from tokenrouter_backend.core.signals.cost_model import (
    BranchCosts,
    CostConfig,
    CostCurve,
    Curve,
    MeteredBranch,
    Planner,
    expected_tokens,
)

GPU_LIKE = Planner(heavy=Curve(fixed=25.0, per_token=0.01), light=Curve(fixed=4.0, per_token=0.005),
                   heavy_batch=16, light_batch=16)  # memory-bound: 16 x 6 tokens cost what 16 do
CPU_LIKE = Planner(heavy=Curve(fixed=2.0, per_token=40.0), light=Curve(fixed=1.0, per_token=12.0),
                   heavy_batch=8, light_batch=8)  # compute-bound: every scored token costs


def test_flat_gpu_curve_keeps_long_blocks_at_batch_16():
    alone = Planner(GPU_LIKE.heavy, GPU_LIKE.light, heavy_batch=1, light_batch=1)
    for a in (0.85, 0.95):
        assert GPU_LIKE.best_block(a, 16) >= alone.best_block(a, 16) - 1  # load barely shortens them
    assert GPU_LIKE.best_block(0.85, 16) >= 4
    assert GPU_LIKE.best_block(0.95, 16) >= 8


def test_linear_cpu_curve_drives_k_to_zero_at_batch_8():
    assert CPU_LIKE.best_block(0.7, 16) == 0
    assert CPU_LIKE.best_block(0.95, 16) == 0  # even a very good draft cannot pay for its scoring


def test_single_stream_on_a_mixed_curve_drafts_and_load_stops_it():
    one = Planner(heavy=Curve(300.0, 8.0), light=Curve(60.0, 4.0), heavy_batch=1, light_batch=1)
    eight = Planner(heavy=Curve(300.0, 35.0), light=Curve(60.0, 19.0), heavy_batch=8, light_batch=8)
    assert one.best_block(0.8, 16) >= 3
    assert eight.best_block(0.8, 16) == 0
    assert one.best_block(0.05, 16) == 0  # nothing is accepted: heavy alone


def test_planned_block_beats_heavy_only_or_is_heavy_only():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = Planner(Curve(*rng.uniform(0, 300, 2)), Curve(*rng.uniform(0, 100, 2)),
                    rng.integers(1, 17), rng.integers(1, 17))
        a = rng.uniform(0.0, 0.99)
        k = p.best_block(a, 16)
        assert p.tokens_per_ms(k, a) >= p.tokens_per_ms(0, a)


def test_expected_tokens():
    assert expected_tokens(0, 0.7) == pytest.approx(1.0)
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 1.0) == pytest.approx(4.96, abs=0.05)  # clipped below 1: stays finite


def test_light_is_left_out_of_a_long_prompt_with_a_short_answer():
    p = Planner(heavy=Curve(300.0, 8.0), light=Curve(60.0, 4.0))
    assert p.light_estimate(prompt_tokens=200, new_tokens=256, acceptance=0.8, max_block=16, chunk=256).pays
    assert not p.light_estimate(prompt_tokens=2800, new_tokens=32, acceptance=0.8, max_block=16, chunk=256).pays
    assert not CPU_LIKE.light_estimate(prompt_tokens=10, new_tokens=1000, acceptance=0.8, max_block=16,
                                       chunk=256).pays


def test_curve_fit_recovers_fixed_and_per_token_cost():
    curve = CostCurve(window=64, min_samples=8)
    rng = np.random.default_rng(1)
    for _ in range(7):
        curve.observe(1, 5, 100.0, 1)
    assert curve.curve is None  # too few samples
    curve = CostCurve(window=64, min_samples=8)
    for _ in range(40):
        forwards, per = int(rng.integers(1, 6)), int(rng.integers(1, 60))
        curve.observe(forwards, forwards * per, forwards * (30.0 + 2.5 * per) * rng.uniform(0.97, 1.03), 4)
    fit = curve.curve
    assert fit.fixed == pytest.approx(30.0, rel=0.15) and fit.per_token == pytest.approx(2.5, rel=0.1)
    assert 1.0 < curve.batch <= 4.0


def test_curve_fit_leaves_stalls_out():
    """A few steps stalled for seconds (page-ins after a paused VM) do not bend the curve:
    plain least squares over these samples clips per_token to 0."""
    rng = np.random.default_rng(0)
    curve = CostCurve(window=256, min_samples=8)
    for _ in range(120):
        tokens = int(rng.integers(1, 49))
        curve.observe(1, tokens, (220.0 + 20.0 * tokens) * rng.uniform(0.9, 1.1), 8)
    for _ in range(12):
        curve.observe(1, int(rng.integers(1, 9)), 3000.0 * rng.uniform(0.9, 1.2), 1)
    data = np.asarray(curve.samples)
    (_, plain_per_token), *_ = np.linalg.lstsq(data[:, :2], data[:, 2], rcond=None)
    assert plain_per_token < 0  # what the fit did before: clipped to a flat curve
    fit = curve.curve
    assert fit.fixed == pytest.approx(220.0, rel=0.1) and fit.per_token == pytest.approx(20.0, rel=0.1)
    assert curve.stalls == 12 and curve.stall_ratio == pytest.approx(12 / 132)


def test_curve_fit_keeps_contended_steps():
    """Steps slowed by the other branch (up to ~2.6x here) are cost, not stalls: they stay in."""
    rng = np.random.default_rng(2)
    curve = CostCurve(window=256, min_samples=8)
    for i in range(100):
        tokens = int(rng.integers(1, 33))
        slow = 2.6 if i % 3 == 0 else 1.0
        curve.observe(1, tokens, slow * (200.0 + 20.0 * tokens), 4)
    fit = curve.curve
    assert curve.stalls == 0
    assert fit.ms(16) > 1.2 * (200.0 + 20.0 * 16)  # the contended third raises the curve


def test_one_token_count_only_is_not_separable():
    curve = CostCurve(window=64, min_samples=4)
    for _ in range(20):
        curve.observe(2, 2, 80.0, 1)
    assert curve.curve is None


def test_acceptance_prior_and_decay():
    costs = BranchCosts(CostConfig(prior_acceptance=0.5, prior_weight=10))
    assert costs.acceptance == pytest.approx(0.5)
    for _ in range(50):
        costs.observe_verdicts(9, 1)
    assert costs.acceptance > 0.85


def test_metered_branch_feeds_the_curve():
    curve = CostCurve(window=16, min_samples=2)
    branch = MeteredBranch(FakeBranch("heavy", ToyLM()), curve)

    async def go():
        from tokenrouter_backend.core.protocol.branch_protocol import BranchResult
        inner = branch.inner

        async def timed(op):
            res = await FakeBranch.step(inner, op)
            n = len(op.input_ids)
            return BranchResult(res.tokens, res.token_probs, res.entropy, res.input_probs, res.session_len,
                                forward_ms=10.0 + n, forward_tokens=n, forwards=1)
        inner.step = timed
        await branch.step(BranchOp(1, 0, (1, 2, 3)))
        await branch.step(BranchOp(1, 3, (4,)))
        await branch.release(1)

    asyncio.run(go())
    assert len(curve.samples) == 2 and branch.name == "heavy"
    assert curve.curve == Curve(pytest.approx(10.0), pytest.approx(1.0))


# ---- through Operations' hooks: the plan a request gets --------------------------------
def _ops(**params):
    from tokenrouter_backend.core.protocol.params import RouterDefaults
    from tokenrouter_backend.operations.admission import Operations

    return Operations({k: str(v) for k, v in params.items()}, RouterDefaults())


def _teach(costs, heavy: Curve, light: Curve, batch: int, verdicts: bool = True):
    """Both curves fitted; with ``verdicts`` also 10 verdicts at the prior's own acceptance,
    so the light model counts as measured and the acceptance stays the prior (0.6)."""
    for curve, truth in ((costs.heavy, heavy), (costs.light, light)):
        for tokens in (1, 2, 4, 8, 16, 32) * 5:
            curve.observe(1, tokens * batch, truth.ms(tokens * batch), batch)
    if verdicts:
        costs.observe_verdicts(6, 0)
        costs.observe_verdicts(0, 4)


def _plan(ops, prompt_len=20, **given):
    from tokenrouter_backend.core.protocol.params import RouterDefaults
    from tokenrouter_backend.operations.admission import RequestInfo

    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 256, **given})
    adm = ops.admit(RequestInfo("r", tuple(range(prompt_len)), explicit_mode=True), params)
    return None if adm.hooks is None else adm.hooks.plan(adm.params, adm.params.block_size)


def test_hooks_plan_heavy_steps_on_a_loaded_cpu_and_drafts_on_a_gpu():
    from tokenrouter_backend.core.protocol.names import Mode

    cpu = _ops()
    _teach(cpu.costs, Curve(2.0, 40.0), Curve(1.0, 12.0), batch=8)
    assert _plan(cpu).mode == Mode.HEAVY
    assert _plan(cpu, block_schedule="fixed").mode == Mode.VERIFY  # a fixed schedule keeps its block
    gpu = _ops()
    _teach(gpu.costs, Curve(25.0, 0.01), Curve(4.0, 0.005), batch=16)
    plan = _plan(gpu)
    assert plan.mode == Mode.VERIFY and plan.block >= 2  # prior acceptance 0.6: short, but drafting
    off = _ops(cost_model="false")
    _teach(off.costs, Curve(2.0, 40.0), Curve(1.0, 12.0), batch=8)
    assert _plan(off) is None  # no hooks at all: the request runs its own schedule


def test_overload_degradation_needs_the_server_and_the_request():
    from tokenrouter_backend.core.protocol.names import Mode

    for server, request, expect in ((True, True, True), (True, False, False), (False, True, False)):
        ops = _ops(overload_degradation=str(server).lower())
        ops.load.saturated = True
        plan = _plan(ops, router_mode="route", allow_degradation=request)
        assert plan.degraded == expect and plan.mode == Mode.ROUTE
        assert plan.params.confidence_threshold == pytest.approx(0.6 if expect else 0.8)


# ---- free drafts (n-gram): planned on the heavy curve alone ---------------------------
# the demo heavy on 2 cores (research/notebook/2026-12-01-real-traffic.md)
MEASURED_CPU = Curve(fixed=1257.0, per_token=61.0)


def test_free_drafts_pay_where_the_heavy_forward_has_a_fixed_part():
    two = Planner(MEASURED_CPU, Curve(261.0, 31.0), heavy_batch=2, light_batch=2)
    assert two.best_free_block(0.7, 16) >= 4  # a good copy source: long n-gram drafts
    assert two.best_free_block(0.05, 16) == 0  # copies that never match are not sent
    assert CPU_LIKE.best_free_block(0.9, 16) == 0  # pure per-token cost: even good copies cost a step each
    assert GPU_LIKE.best_free_block(0.5, 16) >= 4  # memory-bound: drafts nearly free
    assert GPU_LIKE.best_free_block(0.9, 16) >= 12
    for a in (0.1, 0.4, 0.7, 0.9):  # never planned below a heavy-only step
        k = two.best_free_block(a, 16)
        assert expected_tokens(k, a) / two.heavy_check_ms(k) >= 1.0 / two.heavy_check_ms(0)


def test_ngram_acceptance_prior_and_verdicts():
    costs = BranchCosts(CostConfig(ngram_prior_acceptance=0.5, prior_weight=8))
    assert costs.ngram_acceptance == pytest.approx(0.5)
    costs.observe_ngram_verdicts(0, 40)
    assert costs.ngram_acceptance < 0.1
    assert costs.acceptance == pytest.approx(0.6)  # the light drafts' estimate is separate
    with pytest.raises(ValueError):
        CostConfig(ngram_prior_acceptance=1.0)


def test_hooks_plan_ngram_drafts_into_heavy_steps_until_they_stop_matching():
    from tokenrouter_backend.core.loop.hooks import BlockRecord
    from tokenrouter_backend.core.protocol.names import Mode

    ops = _ops()
    _teach(ops.costs, MEASURED_CPU, Curve(261.0, 31.0), batch=8)
    plan = _plan(ops, prompt_len=3000, max_tokens=48)  # long prompt, short answer: light left out
    assert plan.mode == Mode.HEAVY and plan.free_drafts >= 1  # prior 0.5 at batch 8: short copies
    quiet = _ops()
    _teach(quiet.costs, MEASURED_CPU, Curve(261.0, 31.0), batch=2)
    assert _plan(quiet, prompt_len=3000, max_tokens=48).free_drafts >= 2  # a smaller batch: longer ones
    assert _plan(ops, prompt_len=3000, max_tokens=48, ngram_drafts=False).free_drafts == 0
    routed = _plan(ops, prompt_len=3000, max_tokens=48, router_mode="route")  # heavy-only steps: copies too
    assert routed.mode == Mode.HEAVY and routed.free_drafts >= 1
    assert _plan(ops, prompt_len=20, max_tokens=256, router_mode="route").free_drafts == 0  # drafting: none
    hooks = ops.admit(*_admission(prompt_len=3000)).hooks
    for _ in range(12):  # every n-gram draft rejected at its first token
        hooks.after_block(BlockRecord("r", 0, "verify", "ngram", 8, (), (), (), 0, (), (), 0, 1,
                                      100.0, 100.0, 0.0, 100.0, 1, ngram_drafted=8, ngram_accepted=0))
    assert hooks.plan(hooks_params(), 4).free_drafts == 0  # the request stopped paying for them


def _admission(prompt_len):
    from tokenrouter_backend.operations.admission import RequestInfo

    return RequestInfo("r", tuple(range(prompt_len)), explicit_mode=True), hooks_params()


def hooks_params():
    from tokenrouter_backend.core.protocol.params import RouterDefaults

    return RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 48})


def test_the_light_decision_is_planned_and_reported_in_routing_stats():
    """The estimate behind ``light_skipped``: the saving and the prefill it was weighed
    against reach the plan, and through the block loop the request's routing_stats (the
    last decision made)."""
    from support.fakes import make_pair
    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
    from tokenrouter_backend.core.protocol.names import Mode

    p = Planner(heavy=Curve(300.0, 8.0), light=Curve(60.0, 4.0))
    est = p.light_estimate(prompt_tokens=2800, new_tokens=32, acceptance=0.8, max_block=16, chunk=256)
    assert not est.pays and est.prefill_ms == pytest.approx(11 * 60.0 + 4.0 * 2800)
    assert 0 < est.saving_ms < est.prefill_ms and est.block == p.best_block(0.8, 16) and est.acceptance == 0.8

    ops = _ops()
    _teach(ops.costs, MEASURED_CPU, Curve(261.0, 31.0), batch=1)
    long_plan = _plan(ops, prompt_len=3000, max_tokens=48)
    assert long_plan.mode == Mode.HEAVY and not long_plan.light_estimate.pays
    assert long_plan.light_estimate.prefill_ms > long_plan.light_estimate.saving_ms

    info, params = _admission(prompt_len=40)
    params = dataclasses.replace(params, max_tokens=12)
    hooks = ops.admit(info, params).hooks
    light, heavy = make_pair()
    stats = asyncio.run(generate(GenerationRequest([i % 30 + 1 for i in range(40)], params), light, heavy,
                                 lambda *_: None, session_id=5, hooks=hooks))
    first = hooks.light
    assert stats.light_plan_prefill_ms == pytest.approx(first.prefill_ms)
    assert stats.light_plan_saving_ms == pytest.approx(first.saving_ms)
    assert stats.light_plan_acceptance == pytest.approx(first.acceptance)
    assert stats.light_skipped == (not first.pays)
    assert "light_plan_prefill_ms" in stats.to_dict()
    assert stats.light_plan_rest == pytest.approx(first.rest) and 0 < first.rest <= 12


def _record(position: int, committed: int, light_ms: float = 0.0):
    from tokenrouter_backend.core.loop.hooks import BlockRecord

    return BlockRecord("r", position, "verify", "heavy", 1, (), (), (), 0, (), (), 0, 1, 100.0, 100.0, light_ms,
                       100.0, committed)


def test_recent_short_answers_keep_the_light_model_out_until_an_answer_runs_long():
    """The light decision weighs its prefill against the expected REST of the answer (recent
    answers to prompts with the same signals), not max_tokens; it is asked again at every
    block until the light model is in, so an answer that outlives its peers brings it in late."""
    from tokenrouter_backend.core.protocol.names import Mode
    from tokenrouter_backend.core.signals.answer_length import LengthSignal

    ops = _ops()
    _teach(ops.costs, Curve(60.0, 6.0), Curve(20.0, 2.0), batch=1)
    assert _plan(ops, prompt_len=300, max_tokens=256).light_estimate.pays  # no evidence: up to max_tokens
    signal = LengthSignal.of(tuple(range(300)), 256)
    for n in (3, 4, 4, 5, 5, 6):
        ops.lengths.observe(signal, n)
    info, params = _admission(prompt_len=300)
    hooks = ops.admit(info, dataclasses.replace(params, max_tokens=256)).hooks
    plan = hooks.plan(dataclasses.replace(params, max_tokens=256), 4)
    assert plan.mode == Mode.HEAVY and not plan.light_estimate.pays
    assert plan.light_estimate.rest == pytest.approx(4.5)  # mean of the six answers, none ended yet
    hooks.after_block(_record(0, 3))  # five recent answers outlived 3 tokens, by 1, 1, 2, 2 and 3
    assert hooks.plan(dataclasses.replace(params, max_tokens=256), 4).light_estimate.rest == pytest.approx(1.8)
    hooks.after_block(_record(3, 5))  # 8 tokens: longer than every recent answer, no evidence left
    late = hooks.plan(dataclasses.replace(params, max_tokens=256), 4)
    assert late.mode == Mode.VERIFY and late.light_estimate.pays and late.light_estimate.rest == 248
    hooks.after_block(_record(8, 3, light_ms=50.0))  # the light model ran: its prefill is paid
    kept = late.light_estimate
    for n in (11,) * 8:
        ops.lengths.observe(signal, n)  # recent answers say this one is about to end
    assert hooks.plan(dataclasses.replace(params, max_tokens=256), 4).light_estimate is kept


def test_until_the_light_curve_is_fitted_it_is_the_heavy_one_scaled():
    """A fresh server whose first requests are long: the light model never ran, yet its
    prefill is weighed (cost_light_ratio) instead of the block schedule paying for it."""
    from tokenrouter_backend.core.protocol.names import Mode

    costs = BranchCosts(CostConfig(light_ratio=0.5))
    assert costs.planner() is None  # nothing known: the block schedule decides
    for tokens in (1, 2, 4, 8, 16, 256) * 5:
        costs.heavy.observe(1, tokens, MEASURED_CPU.ms(tokens), 1)
    planner = costs.planner()
    assert costs.light.curve is None and planner.light == Curve(pytest.approx(628.5), pytest.approx(30.5))
    ops = _ops(cost_light_ratio=0.5)
    for tokens in (1, 2, 4, 8, 16, 256) * 5:
        ops.costs.heavy.observe(1, tokens, MEASURED_CPU.ms(tokens), 1)
    plan = _plan(ops, prompt_len=1000, max_tokens=48, router_mode="route")
    assert plan.mode == Mode.HEAVY and not plan.light_estimate.pays  # the light prefill does not pay
    assert _plan(ops, prompt_len=20, max_tokens=256).light_estimate.pays  # a short prompt, a long answer
    with pytest.raises(ValueError):
        CostConfig(light_ratio=0.0)


MIX_CPU_HEAVY, MIX_CPU_LIGHT = Curve(448.0, 15.2), Curve(155.0, 5.5)  # fitted by the router in the mix


def test_route_blocks_are_planned_on_their_own_terms():
    """Route's confident drafts skip the heavy forward's fixed part: where verify falls back
    to heavy-only steps (8 requests on this CPU) route still drafts when its drafts stand,
    and does not when they never do."""
    p = Planner(MIX_CPU_HEAVY, MIX_CPU_LIGHT, heavy_batch=8, light_batch=8)
    assert p.best_block(0.5, 16) == 0  # verify: heavy-only steps
    assert p.best_route_block(0.5, 0.8, 16) >= 2
    assert p.route_rate(4, 0.5, 0.8) > p.route_rate(0, 0.5, 0.8)
    assert p.best_route_block(0.5, 0.05, 16) == 0  # nothing stands: heavy-only steps again
    assert p.route_rate(0, 0.6, 0.8) == pytest.approx(p.tokens_per_ms(0, 0.6))
    # s = 1: every draft stands, k tokens for k light forwards, the heavy per-token cost, no fixed part
    one = p.route_rate(3, 0.6, 0.999)
    assert one == pytest.approx(3 / (3 * (155 / 8 + 5.5) + 15.2 * 4), rel=0.01)
    est = p.light_estimate(40, 48, 0.5, 16, 256, route_stand=0.8)
    assert est.pays and est.block == p.best_route_block(0.5, 0.8, 16)
    assert not p.light_estimate(40, 48, 0.5, 16, 256).pays  # verify's own estimate: drafting never pays


def test_hooks_learn_the_route_stand_rate_from_route_blocks():
    from tokenrouter_backend.core.loop.hooks import Action, BlockRecord
    from tokenrouter_backend.core.protocol.names import Mode

    ops = _ops(cost_route_prior_stand=0.5)
    _teach(ops.costs, MIX_CPU_HEAVY, MIX_CPU_LIGHT, batch=8)
    info, params = _admission(prompt_len=40)
    params = dataclasses.replace(params, mode=Mode.ROUTE)
    hooks = ops.admit(info, params).hooks
    for action, stood in ((Action.ACCEPT, 4), (Action.FALLBACK, 3)) * 10:  # 4 of 4 stand, then 3 of 4
        hooks.after_block(BlockRecord("r", 0, "route", action, 4, (1, 2, 3, 4), (0.9,) * 4, (0.1,) * 4, stood,
                                      (), (), 0, int(action == Action.FALLBACK), 0.0, 0.0, 0.0, 0.0, stood))
    assert ops.costs.route_stand > 0.8 and hooks.route_stand() > 0.8  # 70 stood, 10 unsure, prior 0.5 x 8
    plan = hooks.plan(params, 4)
    assert plan.mode == Mode.ROUTE and plan.block >= 2
    for _ in range(400):  # then nothing stands any more, and the heavy model rejects the unsure drafts
        hooks.after_block(BlockRecord("r", 0, "route", Action.FALLBACK, 4, (1, 2, 3, 4), (0.3,) * 4,
                                      (2.0,) * 4, 0, (False,), (0.1,), 0, 1, 0.0, 0.0, 0.0, 0.0, 1))
    assert hooks.route_stand() < 0.2 and hooks.acceptance() < 0.2
    assert hooks.plan(params, 4).mode == Mode.HEAVY


def test_the_light_batch_is_never_planned_below_the_heavy_one():
    """Under load the plan keeps the light model idle, so its own mean batch stays what it was
    at the last quiet moment; drafting requests would reach it as a batch as large as heavy's."""
    costs = BranchCosts()
    for tokens in (1, 2, 4, 8, 16, 32) * 5:
        costs.heavy.observe(1, tokens * 8, MIX_CPU_HEAVY.ms(tokens * 8), 8)
        costs.light.observe(1, tokens, MIX_CPU_LIGHT.ms(tokens), 1)
    planner = costs.planner()
    assert costs.light.batch < 1.5
    assert planner.light_batch == pytest.approx(costs.heavy.batch) and planner.light_batch > 7


def test_an_unmeasured_light_model_is_explored_by_requests_with_a_cheap_light_prefill():
    """The trap the priors set: a server whose first requests ran heavy-only steps never sees a
    light step or verdict, so with a pessimistic prior every later request would skip the
    light model for good. Until the light model is measured a short prompt explores (the
    block schedule runs); a long one still weighs the prefill; once measured, the curves decide."""
    from tokenrouter_backend.core.protocol.names import Mode

    ops = _ops(cost_light_ratio=4.0)  # the prior: a light forward costs 4 heavy ones, never pays
    for tokens in (1, 2, 4, 8, 16, 256) * 5:
        ops.costs.heavy.observe(1, tokens, MEASURED_CPU.ms(tokens), 1)
    assert not ops.costs.light_measured
    short = _plan(ops, prompt_len=20, max_tokens=256)
    assert short.light_estimate.explore and short.light_estimate.pays
    assert short.mode == Mode.VERIFY and short.block == hooks_params().block_size  # the block schedule's block
    assert short.light_estimate.saving_ms < short.light_estimate.prefill_ms  # the prior alone would skip it
    long = _plan(ops, prompt_len=3000, max_tokens=48)
    assert long.mode == Mode.HEAVY and not long.light_estimate.explore and not long.light_estimate.pays
    never = _ops(cost_light_ratio=4.0, cost_explore_share=0)
    for tokens in (1, 2, 4, 8, 16, 256) * 5:
        never.costs.heavy.observe(1, tokens, MEASURED_CPU.ms(tokens), 1)
    assert _plan(never, prompt_len=20, max_tokens=256).mode == Mode.HEAVY  # the trap, kept on request

    for tokens in (1, 2, 4, 8, 16, 32) * 5:  # the exploring requests' light steps: a cheap light model
        ops.costs.light.observe(1, tokens, Curve(250.0, 12.0).ms(tokens), 1)
    assert not ops.costs.light_measured  # the curve alone: no verdict yet
    assert _plan(ops, prompt_len=20, max_tokens=256).light_estimate.explore
    ops.costs.observe_verdicts(12, 1)  # and their verdicts: a good drafter
    assert ops.costs.light_measured
    measured = _plan(ops, prompt_len=20, max_tokens=256)
    assert not measured.light_estimate.explore and measured.light_estimate.pays and measured.mode == Mode.VERIFY
    assert measured.light_estimate.saving_ms > measured.light_estimate.prefill_ms
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            CostConfig(explore_share=bad)


def test_route_blocks_grow_with_the_acceptance_of_their_drafts():
    """One heavy forward checks a block's drafts from its first unsure one: the more of them
    pass (confident ones need only not be strongly rejected), the longer the block worth
    drafting. At the demo pair's fitted CPU curves: acceptance 0.95 plans at least 8 drafts,
    0.5 at most 2."""
    p = Planner(Curve(229.4, 6.8), Curve(32.5, 2.8))
    assert p.best_route_block(0.95, 0.8, 16) >= 8 > 2 >= p.best_route_block(0.5, 0.8, 16)
    # k = 1: the one draft stands, or is checked and passes at a, plus the heavy token
    s, a = 0.8, 0.6
    ms = 32.5 + 2.8 + 6.8 * 2 + (1 - s) * 229.4
    assert p.route_rate(1, a, s) == pytest.approx((s + (1 - s) * (1 + a)) / ms)


def test_a_light_branch_with_lone_steps_is_planned_at_batch_one():
    """A light branch that runs each session's one-token step alone (``lone_steps`` in its
    results) charges every drafting request a whole light forward, whatever the heavy batch;
    the planner then drafts less under load than for a light branch that batches its steps."""
    shared, lone = BranchCosts(), BranchCosts()
    for costs, flag in ((shared, False), (lone, True)):
        for tokens in (1, 2, 4, 8, 16, 32) * 5:
            costs.heavy.observe(1, tokens * 8, MIX_CPU_HEAVY.ms(tokens * 8), 8)
            costs.light.observe(1, tokens, MIX_CPU_LIGHT.ms(tokens), 1, lone_steps=flag)
    assert lone.light.lone_steps and not shared.light.lone_steps
    assert lone.planner().light_batch == 1.0 and shared.planner().light_batch > 7
    assert lone.planner().block_ms(4) > shared.planner().block_ms(4)


def test_a_light_model_in_before_the_curves_were_known_drafts_on():
    """Blocks planned before the heavy curve was fitted run the block schedule (the light model
    comes in); once the curves are known the plan has a light decision and keeps drafting
    where the draft length pays, the prefill being paid."""
    from tokenrouter_backend.core.protocol.names import Mode

    ops = _ops()
    info, params = _admission(prompt_len=40)
    hooks = ops.admit(info, params).hooks
    assert hooks.plan(params, 4).mode == Mode.VERIFY and hooks.light is None  # no curve yet
    hooks.after_block(_record(0, 3, light_ms=50.0))  # the light model ran
    _teach(ops.costs, Curve(25.0, 0.01), Curve(4.0, 0.005), batch=1)  # a GPU-like pair: drafting pays
    plan = hooks.plan(params, 4)
    assert hooks.light is not None and plan.mode == Mode.VERIFY and plan.block >= 1
