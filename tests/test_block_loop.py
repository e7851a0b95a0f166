"""Block loop against scripted branches: losslessness, route limits, stops, KV sync, release."""
from __future__ import annotations

import asyncio
import math
from collections import Counter

import numpy as np
import pytest

from support.fakes import VOCAB, FakeBranch, ToyLM, make_pair
from tokenrouter_backend.core.loop.block_loop import BlockLoop, GenerationRequest, RequestCancelled, generate
from tokenrouter_backend.core.protocol.params import RouterDefaults

PROMPTS = [tuple(int(x) for x in np.random.default_rng(i).integers(0, VOCAB, size=3 + i % 7)) for i in range(24)]


def run(prompt, mode, light=None, heavy=None, **given):
    light, heavy = (light, heavy) if light else make_pair()
    defaults = RouterDefaults(heavy_first=given.pop("heavy_first", True))
    params = defaults.request_params({"router_mode": mode, "max_tokens": given.pop("max_tokens", 24), **given})
    emitted = []

    def emit(tokens, stats, finished):
        emitted.append((list(tokens), finished))

    stats = asyncio.run(generate(GenerationRequest(prompt, params), light, heavy, emit, session_id=7))
    out = [t for chunk, _ in emitted for t in chunk]
    assert [f for _, f in emitted].count(True) == 1 and emitted[-1][1]
    assert not light.sessions and not heavy.sessions, "sessions must be released"
    return out, stats, light, heavy


@pytest.mark.parametrize("block_size", [1, 3, 5, 8])
@pytest.mark.parametrize("schedule", ["fixed", "heuristic"])
def test_verify_equals_heavy_greedy(block_size, schedule):
    for prompt in PROMPTS:
        ref, _, _, _ = run(prompt, "heavy")
        out, stats, _, _ = run(prompt, "verify", block_size=block_size, block_schedule=schedule)
        assert out == ref, f"prompt {prompt}"
        assert stats.generated_tokens == len(out) == stats.light_tokens + stats.heavy_tokens + stats.ngram_tokens


def test_verify_accepts_drafts_and_saves_heavy_calls():
    out, stats, light, heavy = run(PROMPTS[0], "verify", max_tokens=48, block_size=4)
    assert stats.drafts_accepted > 0 and stats.drafts_proposed >= stats.drafts_accepted
    assert heavy.calls < len(out), "verify must need fewer heavy calls than tokens"
    assert 0 < stats.light_share < 1


def test_heavy_mode_block_of_k_is_one_call_per_block():
    out, stats, light, heavy = run(PROMPTS[1], "heavy", max_tokens=20, block_size=5, block_schedule="fixed")
    assert len(out) == 20 and heavy.calls == 4 and light.calls == 0
    assert stats.heavy_tokens == 20


def test_route_threshold_zero_equals_light():
    # every draft stands unchecked; the one heavy check before the end rejects nothing at
    # rollback_threshold 0 (the toy pair has no end token)
    for prompt in PROMPTS[:10]:
        ref, _, _, _ = run(prompt, "light")
        out, stats, _, heavy = run(prompt, "route", confidence_threshold=0.0, rollback_threshold=0.0, heavy_first=False)
        assert out == ref and heavy.calls == 1 and stats.light_share == 1.0


def test_route_threshold_above_one_equals_verify():
    for prompt in PROMPTS[:10]:
        ref, _, _, _ = run(prompt, "verify")
        out, stats, _, heavy = run(prompt, "route", confidence_threshold=1.5, heavy_first=False)
        assert out == ref
        # nothing was committed unchecked: every block went through the heavy model
        assert stats.verify_blocks == heavy.calls and stats.rollbacks == 0


def test_route_mixes_and_rolls_back():
    # noisy light, strict rollback: some committed tokens get rolled back
    light, heavy = FakeBranch("light", ToyLM(seed=3, noise=1.5)), FakeBranch("heavy", ToyLM())
    total_rollbacks = 0
    for prompt in PROMPTS[:12]:
        params = RouterDefaults().request_params(
            {"router_mode": "route", "max_tokens": 40, "confidence_threshold": 0.5, "rollback_threshold": 1.0}
        )
        loop = BlockLoop(GenerationRequest(prompt, params), light, heavy, session_id=1)

        async def drive(loop: BlockLoop) -> None:
            while not loop.done:
                await loop.run_block()
            await loop.release()

        asyncio.run(drive(loop))
        total_rollbacks += loop.state.stats.rollbacks
        # every token the heavy model vouched for is exactly heavy-greedy
        ref, _, _, _ = run(prompt, "heavy", max_tokens=40)
        t = loop.state.transcript
        verified = t.verified_len - t.prompt_len
        assert t.answer[:verified] == ref[:verified]
    assert total_rollbacks > 0


def test_route_streams_nothing_rollback_can_touch():
    light, heavy = FakeBranch("light", ToyLM(seed=3, noise=1.5)), FakeBranch("heavy", ToyLM())
    chunks = []
    params = RouterDefaults().request_params(
        {"router_mode": "route", "max_tokens": 60, "confidence_threshold": 0.3, "rollback_threshold": 1.0,
         "rollback_window": 4}
    )

    def emit(tokens, stats, finished):
        chunks.append(list(tokens))

    asyncio.run(generate(GenerationRequest(PROMPTS[2], params), light, heavy, emit, session_id=3))
    streamed = [t for c in chunks for t in c]
    assert len(chunks) > 2 and len(streamed) == 60


def test_speculative_sampling_matches_heavy_distribution():
    """First generated token under verify+sampling is distributed as heavy sampling."""
    prompt = PROMPTS[3]
    counts_v, counts_h = Counter(), Counter()
    n = 600
    for seed in range(n):
        g = {"temperature": 1.0, "random_seed": seed, "max_tokens": 2, "block_size": 3}
        counts_v[run(prompt, "verify", **g)[0][0]] += 1
        counts_h[run(prompt, "heavy", random_seed=seed + 10_000, temperature=1.0, max_tokens=1)[0][0]] += 1
    # the exact heavy distribution for the first token
    from tokenrouter_backend.core.loop.sampling import softmax
    p = softmax(ToyLM().logits(list(prompt))[None])[0]
    for counts in (counts_v, counts_h):
        freq = np.array([counts[i] for i in range(VOCAB)]) / n
        tv = 0.5 * np.abs(freq - p).sum()
        assert tv < 0.12, f"total variation {tv:.3f}"


def test_end_id_and_stop_words_cut_output():
    ref, _, _, _ = run(PROMPTS[4], "heavy", max_tokens=30)
    end = ref[6]
    first = ref.index(end)
    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 30})
    out = []
    stats = asyncio.run(generate(GenerationRequest(PROMPTS[4], params, end_id=end), light, heavy,
                                 lambda t, s, f: out.extend(t), session_id=1))
    assert out == ref[:first] and stats.finish_reason == "end_id"
    stop = tuple(ref[10:12])
    cut = next(i for i in range(len(ref)) if tuple(ref[i : i + 2]) == stop)
    out2 = []
    stats = asyncio.run(generate(GenerationRequest(PROMPTS[4], params, stop_sequences=(stop,)), *make_pair(),
                                 lambda t, s, f: out2.extend(t), session_id=1))
    assert out2 == ref[:cut] and stats.finish_reason == "stop_words"


def test_cancel_and_branch_error_release_sessions():
    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 30})
    calls = {"n": 0}

    def cancelled():
        calls["n"] += 1
        return calls["n"] > 2

    with pytest.raises(RequestCancelled):
        asyncio.run(generate(GenerationRequest(PROMPTS[5], params), light, heavy, lambda *a: None, cancelled))
    assert not light.sessions and not heavy.sessions
    bad = FakeBranch("heavy", ToyLM(), fail_with="boom")
    with pytest.raises(Exception, match="heavy: boom"):
        asyncio.run(generate(GenerationRequest(PROMPTS[5], params), light, bad, lambda *a: None))
    assert not light.sessions


def test_expired_session_is_reprefilled():
    light, heavy = make_pair()
    params = RouterDefaults().request_params({"router_mode": "verify", "max_tokens": 20})
    ref, _, _, _ = run(PROMPTS[6], "verify", max_tokens=20)
    out = []

    def emit(tokens, stats, finished):
        out.extend(tokens)
        heavy.sessions.clear()  # the heavy branch evicts the session between blocks

    asyncio.run(generate(GenerationRequest(PROMPTS[6], params), light, heavy, emit, session_id=5))
    assert out == ref


def test_stats_timings_add_up():
    _, stats, _, _ = run(PROMPTS[7], "verify")
    assert stats.total_ms >= stats.light_ms + stats.heavy_ms - 1e-6
    assert math.isclose(stats.router_overhead_ms, stats.total_ms - stats.light_ms - stats.heavy_ms, abs_tol=1e-3)


# ---- heavy first, chunked prefill ---------------------------------------------------------
def test_heavy_first_emits_heavy_token_before_the_light_model_runs():
    for mode in ("verify", "route"):
        light, heavy = make_pair()
        seen = []

        def emit(tokens, stats, finished, light=light, heavy=heavy, seen=seen):
            seen.append((list(tokens), light.calls, heavy.calls))

        params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 12, "stream": True})
        asyncio.run(generate(GenerationRequest(PROMPTS[3], params), light, heavy, emit, session_id=3))
        first_tokens, light_calls, heavy_calls = seen[0]
        ref, _, _, _ = run(PROMPTS[3], "heavy", max_tokens=1)
        assert first_tokens == ref and light_calls == 0 and heavy_calls == 1, mode


def test_verify_equals_heavy_with_and_without_heavy_first():
    for prompt in PROMPTS[:8]:
        ref, _, _, _ = run(prompt, "heavy")
        for first in (True, False):
            out, _, _, _ = run(prompt, "verify", heavy_first=first)
            assert out == ref


def test_chunked_prefill_sends_long_prompts_in_calls_of_the_chunk_and_changes_nothing():
    prompt = tuple(int(x) for x in np.random.default_rng(5).integers(0, VOCAB, size=50))
    ref, _, _, _ = run(prompt, "verify")
    light, heavy = make_pair()
    defaults = RouterDefaults(prefill_chunk_tokens=8)
    params = defaults.request_params({"router_mode": "verify", "max_tokens": 24})
    out = []
    asyncio.run(generate(GenerationRequest(prompt, params), light, heavy, lambda t, s, f: out.extend(t), session_id=4))
    assert out == ref
    sizes = [len(op.input_ids) for op in heavy.ops if not op.release]
    assert sizes[:6] == [8] * 6 and sizes[6] <= 8  # 50 tokens: six chunks of 8, then the rest
    assert all(op.score_last == 1 and op.draft_len == 0 for op in heavy.ops[:6])


def test_a_vanished_session_is_re_prefilled_and_counted():
    light, heavy = make_pair()

    class Forgetful(type(heavy)):
        async def step(self, op):
            if len(self.ops) == 3:
                self.sessions.clear()  # the branch dropped the session (TTL) between calls
            return await super().step(op)

    heavy.__class__ = Forgetful
    ref, _, _, _ = run(PROMPTS[2], "verify")
    out, stats, _, _ = run(PROMPTS[2], "verify", light=light, heavy=heavy)
    assert out == ref and stats.reprefills == 1 and stats.reprefill_tokens > 0


def test_route_check_holds_later_confident_drafts_to_the_rollback_rule():
    """A heavy check from a block's first unsure draft verifies the unsure drafts (each is the
    heavy model's greedy choice) and lets a later confident draft stand unless strongly
    rejected. A draft kept unchecked right after a verified one exists only under that rule:
    otherwise a check ends on the heavy model's own token."""
    light, heavy = FakeBranch("light", ToyLM(seed=3, noise=1.5)), FakeBranch("heavy", ToyLM())
    after_verified = verified = 0
    for prompt in PROMPTS:
        out, stats, _, _ = run(prompt, "route", light=light, heavy=heavy, max_tokens=40, block_size=8,
                               block_schedule="fixed", confidence_threshold=0.5, rollback_threshold=0.0,
                               heavy_first=False)
        seq, kinds = list(prompt) + out, stats.token_kinds
        for i, kind in enumerate(kinds):
            if kind == "v":
                verified += 1
                assert out[i] == int(np.argmax(ToyLM().logits(seq[: len(prompt) + i])))
            after_verified += kind == "u" and i > 0 and kinds[i - 1] == "v"
    assert verified > 0 and after_verified > 0


def test_routing_stats_break_a_request_into_phases():
    """queue (given by the glue), each branch's first step, when the light model came in,
    and the time awaiting the sender: what a short answer's time is spent on."""
    import asyncio
    import dataclasses
    import time

    from support.fakes import make_pair
    from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
    from tokenrouter_backend.core.protocol.params import RouterDefaults

    def slow_emit(*_):
        time.sleep(0.002)

    prompt = [i % 30 + 1 for i in range(24)]
    for mode in ("verify", "heavy"):
        params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 12, "stream": True})
        light, heavy = make_pair()
        request = dataclasses.replace(GenerationRequest(prompt, params), queued_ms=12.5)
        s = asyncio.run(generate(request, light, heavy, slow_emit, session_id=3))
        assert s.queue_ms == 12.5 and 0 < s.heavy_first_ms <= s.heavy_ms
        assert s.emit_ms >= 2.0  # the sender was awaited at least once
        if mode == "heavy":
            assert s.light_first_ms == s.light_start_ms == 0.0
        else:  # streamed verify: the heavy model's first token first, the light model after it
            assert 0 < s.light_first_ms <= s.light_ms
            assert s.light_start_ms >= s.heavy_first_ms and s.light_start_ms <= s.total_ms
