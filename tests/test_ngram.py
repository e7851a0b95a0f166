"""n-gram drafts: the lookup, the drafter's back-off, and lossless use in the block loop."""
from __future__ import annotations

import numpy as np
from test_block_loop import run

from support.fakes import make_pair
from tokenrouter_backend.core.loop.acceptance import one_hot
from tokenrouter_backend.core.loop.ngram import NgramDrafter, lookup
from tokenrouter_backend.core.protocol.params import InvalidRequest, NgramSettings, RouterDefaults


def test_lookup_takes_the_latest_longest_match():
    seq = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 6, 1, 2, 3]
    assert lookup(seq, 2, 3, 4) == [9, 9, 5, 2]  # "1 2 3" occurred at 0: the longest suffix wins
    assert lookup(seq[:-1] + [4], 2, 3, 4) == []  # "2 4" never occurred
    assert lookup([5, 2, 3, 7, 1, 2, 3, 8, 0, 2, 3], 2, 2, 3) == [8, 0, 2]  # latest of two "2 3"
    assert lookup([4, 4, 4], 2, 2, 5) == [4]  # only what follows inside the sequence
    assert lookup([1, 2], 2, 3, 5) == []  # too short to repeat
    assert lookup([7, 1, 2, 3, 1, 2, 3], 3, 3, 2) == [1, 2]


def test_one_hot_is_the_deterministic_proposal():
    q = one_hot([3, 0], 5)
    assert q.shape == (2, 5) and q[0, 3] == 1 and q[1, 0] == 1 and q.sum() == 2


def test_drafter_grows_halves_and_backs_off():
    d = NgramDrafter(NgramSettings(first_draft=8, max_draft=16))
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]
    assert d.propose(seq, room=100) == [4, 5, 6, 7, 8, 9, 10, 11]
    d.update(8, 8)
    assert d.length == 12
    d.update(12, 0)  # rejected at once: next block goes to the light model
    assert d.length == 6 and d.propose(seq, room=100) == []
    assert d.propose(seq, room=3) == [4, 5, 6]
    assert NgramDrafter(NgramSettings(enabled=False)).propose(seq, 10) == []


def test_params_validate_ngram_knobs():
    p = RouterDefaults().request_params({"ngram_drafts": False})
    assert not p.ngram.enabled and p.ngram.min_n == 3 and p.ngram.max_n == 5
    for bad in ({"ngram_min": 0}, {"ngram_min": 4, "ngram_max": 3}, {"ngram_max_draft": 0}):
        try:
            RouterDefaults(**bad).request_params({})
        except InvalidRequest as exc:
            assert next(iter(bad)) in str(exc) or "ngram_max" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def copy_prompt():
    """A prompt holding heavy's own continuation of its last 3 tokens (the toy LM looks at
    3 tokens): the answer copies the prompt, as a rewrite of given code does."""
    base = tuple(int(t) for t in np.random.default_rng(3).integers(0, 40, 4))
    ref, _, _, _ = run(base, "heavy", max_tokens=40, ngram_drafts=False)
    return tuple(ref[:34]) + (1, 2, 5, 7) + tuple(ref[:3])


def test_verify_with_ngram_drafts_equals_heavy_and_saves_light_calls():
    prompt = copy_prompt()
    ref, _, _, _ = run(prompt, "heavy", max_tokens=30)
    out, stats, light, _ = run(prompt, "verify", max_tokens=30)
    off, stats_off, light_off, _ = run(prompt, "verify", max_tokens=30, ngram_drafts=False)
    assert out == ref == off
    assert stats.ngram_blocks > 0 and stats.ngram_drafts_accepted >= 20
    assert stats.ngram_drafts_accepted <= stats.ngram_drafts_proposed
    assert stats.generated_tokens == stats.light_tokens + stats.heavy_tokens + stats.ngram_tokens
    assert stats.ngram_tokens == stats.ngram_drafts_accepted
    assert light.calls < light_off.calls and stats_off.ngram_blocks == 0


def test_route_sends_ngram_drafts_to_heavy():
    prompt = copy_prompt()
    ref, _, _, _ = run(prompt, "heavy", max_tokens=30)
    light, heavy = make_pair()
    # threshold above 1: no light token may stand unchecked, so route is exact here
    out, stats, _, _ = run(prompt, "route", light, heavy, max_tokens=30, confidence_threshold=1.5,
                           ngram_drafts=True)  # route uses them only when asked
    assert out == ref
    assert stats.ngram_tokens >= 20 and stats.ngram_drafts_accepted == stats.ngram_tokens


def test_sampled_verify_with_ngram_drafts_is_reproducible():
    prompt = copy_prompt()
    a, sa, _, _ = run(prompt, "verify", max_tokens=30, temperature=0.3, random_seed=11)
    b, _, _, _ = run(prompt, "verify", max_tokens=30, temperature=0.3, random_seed=11)
    assert a == b and len(a) == 30 and sa.ngram_blocks > 0


def test_answer_cache_follows_an_earlier_answer_while_the_output_does():
    from tokenrouter_backend.core.loop.answer_cache import AnswerCache, follow

    cache = AnswerCache(entries=2)
    cache.put((1, 2), (5, 6, 7))
    cache.put((3,), (8,))
    assert cache.get((1, 2)) == (5, 6, 7) and cache.get((9,)) == ()
    cache.put((4,), (1,))  # (3,) was least recently used
    assert cache.get((3,)) == () and cache.get((1, 2)) and (cache.hits, cache.lookups) == (2, 4)
    assert follow((5, 6, 7), [5], 5) == [6, 7] and follow((5, 6, 7), [5, 9], 5) == [] and follow((5,), [5], 2) == []
    assert AnswerCache(0).get((1, 2)) == ()


def test_a_repeated_prompt_drafts_its_earlier_answer_losslessly():
    import asyncio

    from tokenrouter_backend.core.loop.answer_cache import AnswerCache
    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate

    cache = AnswerCache()
    prompt = tuple(range(5, 12))
    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 40, "ngram_drafts": True})

    def once():
        light, heavy = make_pair()
        out = []
        stats = asyncio.run(generate(GenerationRequest(prompt, params), light, heavy, lambda t, s, f: out.extend(t),
                                     answers=cache))
        return out, stats, heavy

    first, s1, h1 = once()
    second, s2, h2 = once()
    ref, _, _, _ = run(prompt, "heavy", max_tokens=40)
    assert first == second == ref
    assert not s1.answer_cache_hit and s2.answer_cache_hit
    # every earlier token is drafted and stands; heavy adds one token per check (3 checks of <= 16;
    # not streamed, so the first check also prefills the prompt)
    assert s2.answer_drafts_accepted == s2.answer_drafts_proposed == 37 and s2.heavy_tokens == 3
    assert h2.calls < h1.calls / 2


class HeavyStepsPlan:
    """Hooks planning what the cost model plans for a long prompt: heavy-only steps (the
    light model left out), with at most ``free`` n-gram drafts per heavy check."""

    def __init__(self, free):
        self.free, self.records = free, []

    def plan(self, params, block):
        from tokenrouter_backend.core.loop.hooks import BlockPlan
        from tokenrouter_backend.core.protocol.names import Mode

        return BlockPlan(params, params.block_size, Mode.HEAVY, free_drafts=self.free)

    def after_block(self, record):
        self.records.append(record)


def _run_planned(prompt, mode, free, **given):
    import asyncio

    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate

    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 30, **given})
    out, hooks = [], HeavyStepsPlan(free)
    stats = asyncio.run(generate(GenerationRequest(prompt, params), light, heavy,
                                 lambda tokens, _s, _f: out.extend(tokens), session_id=3, hooks=hooks))
    assert not light.sessions and not heavy.sessions
    return out, stats, light, hooks


def test_heavy_only_steps_still_take_ngram_drafts_the_plan_allows():
    prompt = copy_prompt()
    ref, _, _, _ = run(prompt, "heavy", max_tokens=30)
    out, stats, light, hooks = _run_planned(prompt, "verify", free=8)
    assert out == ref  # lossless
    assert light.calls == 0 and stats.light_skipped  # the light model never saw the request
    assert stats.ngram_blocks > 0 and stats.ngram_tokens >= 20
    assert max(r.ngram_drafted for r in hooks.records) <= 8  # the plan's cap holds
    assert any(r.action == "ngram" for r in hooks.records)
    none, stats_none, _, _ = _run_planned(prompt, "verify", free=0)
    assert none == ref and stats_none.ngram_blocks == 0  # 0: they do not pay, heavy alone
    off, stats_off, _, _ = _run_planned(prompt, "verify", free=8, ngram_drafts=False)
    assert off == ref and stats_off.ngram_blocks == 0  # the request said no
    route, stats_route, _, _ = _run_planned(prompt, "route", free=8)
    assert route == ref and stats_route.ngram_tokens >= 20  # route's heavy steps take them by default
    route_off, stats_route_off, _, _ = _run_planned(prompt, "route", free=8, ngram_drafts=False)
    assert route_off == ref and stats_route_off.ngram_blocks == 0  # unless the request said no


def test_route_heavy_only_steps_run_a_block_per_heavy_call():
    """The cost model left the light model out of a route request: heavy-only steps run
    block_size tokens per heavy call, as heavy mode does (one call per token would make
    route slower than heavy-only, measured on a long prompt)."""
    prompt = (5, 9, 2, 7, 1)
    ref, _, _, heavy_ref = run(prompt, "heavy", max_tokens=30, ngram_drafts=False)
    out, stats, light, _ = _run_planned(prompt, "route", free=0)
    assert out == ref and light.calls == 0
    assert stats.heavy_calls <= -(-30 // RouterDefaults().block_size) + 2  # a block per call, not 30 calls


def test_heavy_only_steps_send_a_streamed_first_token_alone_before_copies():
    """Copies in heavy-only steps start after the prompt's first token: a streamed answer's
    first token goes out alone (found by test_serving: a decision-cache answer came in one
    chunk when the cost model planned heavy-only steps from the first block)."""
    prompt = copy_prompt()
    _, _, _, hooks = _run_planned(prompt, "verify", free=8, stream=True)
    assert hooks.records[0].action != "ngram" and hooks.records[0].committed == 1
    assert any(r.action == "ngram" for r in hooks.records[1:])
