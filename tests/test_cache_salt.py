"""Tenants apart without a server: the cache salt is checked, keys the answer cache and the
branches' prefix cache (mixed into the first block's key, as vLLM does), travels to a branch
with the step that starts a session, and a request's reuse counters count only its own salt."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from support.fakes import FakeBranch, ToyLM
from support.fixtures_engine import ToyLM as EngineLM
from tokenrouter_backend.branches.in_process import InProcessBranch
from tokenrouter_backend.core.loop.answer_cache import AnswerCache, prompt_key
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, op_from_arrays, op_to_arrays
from tokenrouter_backend.core.protocol.cache_salt import MAX_CACHE_SALT_BYTES, parse_cache_salt, salt_key
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig
from tokenrouter_backend.engine.prefix_cache import ROOT_KEY, block_key
from tokenrouter_backend.serving.request import parse_request
from tokenrouter_backend.serving.router_inputs import RouterInputs

BLOCK = 4
PROMPT = tuple(range(3, 3 + 20))  # 5 full blocks


# ---- the value ------------------------------------------------------------------
def test_a_salt_is_text_of_at_most_256_bytes():
    assert parse_cache_salt(None) == "" and parse_cache_salt("") == "" and parse_cache_salt(b"") == ""
    assert parse_cache_salt("tenant-a") == "tenant-a" and parse_cache_salt(b"tenant-a") == "tenant-a"
    assert parse_cache_salt("é" * (MAX_CACHE_SALT_BYTES // 2)) == "é" * 128  # counted in UTF-8 bytes
    for bad, words in (("é" * 129, "258 bytes; at most 256"), ("x" * 257, "257 bytes"), (b"\xff\xfe", "UTF-8"),
                       ("\ud800", "UTF-8"), (7, "must be a string; got int"), ([b"a"], "got list")):
        with pytest.raises(InvalidRequest, match="cache_salt") as info:
            parse_cache_salt(bad)
        assert words in str(info.value)


def test_salt_keys_name_tenants_and_salt_less_is_the_root():
    assert salt_key("") == ROOT_KEY == b""
    keys = {salt_key(s) for s in ("a", "b", "A", "a ", "tenant-1", "tenant-2")}
    assert len(keys) == 6 and all(len(k) == 16 for k in keys)
    assert salt_key("a") == salt_key("a")
    # mixed into the first block's key; every later block's key follows through the chain
    first = {s: block_key(salt_key(s), PROMPT[:4]) for s in ("", "a", "b")}
    assert len(set(first.values())) == 3 and first[""] == block_key(ROOT_KEY, PROMPT[:4])
    assert len({block_key(k, PROMPT[4:8]) for k in first.values()}) == 3


# ---- the answer cache ---------------------------------------------------------------
def test_the_answer_cache_answers_only_the_same_salt():
    cache = AnswerCache(8)
    cache.put(PROMPT, (1, 2, 3), "a")
    assert cache.get(PROMPT, "a") == (1, 2, 3)
    assert cache.get(PROMPT, "b") == () and cache.get(PROMPT) == () and cache.get(PROMPT, "a ") == ()
    cache.put(PROMPT, (4, 5))  # salt-less requests: one shared tenant, as before
    assert cache.get(PROMPT) == (4, 5) and cache.get(PROMPT, "a") == (1, 2, 3)
    assert prompt_key(PROMPT) != prompt_key(PROMPT, "a") != prompt_key(PROMPT, "b")
    assert len(cache) == 2


# ---- the branch contract ------------------------------------------------------------
def test_the_salt_crosses_the_branch_tensors_only_when_set():
    plain = op_to_arrays(BranchOp(1, 0, (5, 6)))
    assert "cache_salt" not in plain and op_from_arrays(plain.get).cache_salt == ""
    arrays = op_to_arrays(BranchOp(1, 0, (5, 6), cache_salt="tenant-é"))
    assert arrays["cache_salt"].shape == (1, 1) and arrays["cache_salt"].dtype == np.object_
    assert op_from_arrays(arrays.get).cache_salt == "tenant-é"
    arrays["cache_salt"] = np.array([[b"x" * 300]], dtype=np.object_)
    with pytest.raises(ValueError, match="branch input cache_salt is 300 bytes"):
        op_from_arrays(arrays.get)


def _engine(cache=True) -> BranchEngine:
    config = EngineConfig(prefix_cache=cache, prefix_cache_block_tokens=BLOCK)
    return BranchEngine(EngineLM(max_positions=256), config=config, name="heavy")


def _step(eng, op):
    (res,) = eng.run([op])
    assert not isinstance(res, Exception), res
    return res


def test_prefix_blocks_are_shared_only_within_a_salt():
    eng, plain = _engine(), _engine(cache=False)
    reference = _step(plain, BranchOp(1, 0, PROMPT, draft_len=3, score_last=1))
    reused = {}
    for sid, salt in enumerate(("a", "a", "b", "", "", "b"), start=1):
        res = _step(eng, BranchOp(sid, 0, PROMPT, draft_len=3, score_last=1, cache_salt=salt))
        np.testing.assert_array_equal(res.tokens, reference.tokens)  # the answer never depends on the salt
        np.testing.assert_allclose(res.token_probs, reference.token_probs, atol=1e-5)
        reused.setdefault(salt, []).append(res.reused_tokens)
        eng.run([BranchOp(sid, 0, (1,), release=True)])
    # the first of each tenant finds nothing; its second reuses all but the scored position
    assert reused == {"a": [0, 19], "b": [0, 19], "": [0, 19]}
    assert eng.store.prefix_cache.block_count == 3 * 5


def test_a_session_keeps_its_salt_across_chunks_and_restarts():
    eng = _engine()
    # tenant a sends the prompt in two chunks: only the first step carries the salt
    _step(eng, BranchOp(1, 0, PROMPT[:8], score_last=1, cache_salt="a"))
    _step(eng, BranchOp(1, 8, PROMPT[8:], score_last=1))
    eng.run([BranchOp(1, 0, (1,), release=True)])
    assert _step(eng, BranchOp(2, 0, PROMPT, score_last=1)).reused_tokens == 0  # salt-less: nothing
    assert _step(eng, BranchOp(3, 0, PROMPT, score_last=1, cache_salt="b")).reused_tokens == 0
    assert _step(eng, BranchOp(4, 0, PROMPT, score_last=1, cache_salt="a")).reused_tokens == 19
    # a session started again at keep_len 0 under another salt takes that salt's blocks only
    assert _step(eng, BranchOp(4, 0, PROMPT, score_last=1, cache_salt="c")).reused_tokens == 0


# ---- one request, end to end in the core ----------------------------------------------
def _generate(light, heavy, answers, salt: str, mode: str = "verify"):
    params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 12})
    out = []

    def emit(tokens, stats, finished):
        out.extend(tokens)

    stats = asyncio.run(generate(GenerationRequest(PROMPT, params, cache_salt=salt), light, heavy, emit,
                                 answers=answers))
    return out, stats


def test_the_salt_travels_with_every_step_that_starts_a_session():
    lm = ToyLM()
    light, heavy = FakeBranch("light", lm), FakeBranch("heavy", lm)
    _generate(light, heavy, AnswerCache(8), "tenant-a")
    for branch in (light, heavy):
        steps = [op for op in branch.ops if not op.release]
        assert steps and all(op.cache_salt == ("tenant-a" if op.keep_len == 0 else "") for op in steps)
        assert any(op.keep_len == 0 for op in steps)


def test_the_prompt_scoring_session_is_salted_too():
    # request-level routing scores the prompt on a light session of its own; its blocks stay
    # cached for the request's own prefill, so they must be the request's tenant's
    from tokenrouter_backend.core.signals.prompt_surprise import measure

    light = FakeBranch("light", ToyLM())
    asyncio.run(measure(light, PROMPT, session_id=5, max_tokens=20, chunk_tokens=8, cache_salt="tenant-a"))
    steps = [op for op in light.ops if not op.release]
    assert len(steps) == 3 and [op.cache_salt for op in steps] == ["tenant-a", "", ""]


def test_reuse_counters_count_only_the_same_salt():
    def branch(name):
        config = EngineConfig(prefix_cache_block_tokens=BLOCK)
        return InProcessBranch(name, BranchEngine(EngineLM(max_positions=256), config=config, name=name))

    light, heavy, answers = branch("light"), branch("heavy"), AnswerCache(8)
    runs = {}
    for salt in ("a", "a", "b", "", ""):
        runs.setdefault(salt, []).append(_generate(light, heavy, answers, salt))
    text = runs["a"][0][0]
    assert all(out == text for tenant in runs.values() for out, _ in tenant)  # correctness unchanged
    for salt, ((_, first), (_, again)) in ((s, r) for s, r in runs.items() if len(r) == 2):
        assert not first.answer_cache_hit and first.answer_drafts_proposed == 0
        assert first.heavy_reused_tokens == first.light_reused_tokens == 0, salt
        assert again.answer_cache_hit and again.heavy_reused_tokens > 0, salt
    (_, other), = runs["b"]  # another tenant, the same prompt, after tenant a's two requests
    assert not other.answer_cache_hit and other.answer_drafts_proposed == other.answer_drafts_accepted == 0
    assert other.heavy_reused_tokens == other.light_reused_tokens == 0


# ---- the router's input ---------------------------------------------------------------
def test_the_router_input_becomes_the_requests_salt():
    def salt(values):
        return parse_request(RouterInputs(prompt=(5, 6), cache_salt=values), RouterDefaults()).cache_salt

    assert salt(()) == "" and salt((b"",)) == "" and salt((b"t-1",)) == "t-1"
    with pytest.raises(InvalidRequest, match="cache_salt must hold one string; got 2"):
        salt((b"a", b"b"))
    with pytest.raises(InvalidRequest, match="cache_salt is 300 bytes"):
        salt((b"x" * 300,))


def test_a_server_may_require_a_salt():
    strict = RouterDefaults.from_config({"require_cache_salt": "true"})
    assert strict.require_cache_salt and not RouterDefaults().require_cache_salt
    assert parse_request(RouterInputs(prompt=(5,), cache_salt=(b"t",)), strict).cache_salt == "t"
    for values in ((), (b"",)):
        with pytest.raises(InvalidRequest, match=r"cache_salt is required by this server \(router parameter "):
            parse_request(RouterInputs(prompt=(5,), cache_salt=values), strict)


# ---- the OpenAI front's field ---------------------------------------------------------
def test_the_openai_field_is_checked_and_passed_on():
    from pydantic import ValidationError

    from tokenrouter_backend.openai_front.errors import OpenAIError
    from tokenrouter_backend.openai_front.protocol import ChatBody, CompletionBody

    body = CompletionBody(model="tokenrouter", prompt="hi", cache_salt="tenant-a")
    body.check()
    assert body.knobs()["cache_salt"] == "tenant-a"
    assert "cache_salt" not in CompletionBody(model="tokenrouter", prompt="hi").knobs()
    chat = ChatBody(model="tokenrouter", messages=[{"role": "user", "content": "hi"}], cache_salt="t")
    chat.check()
    assert chat.knobs()["cache_salt"] == "t"
    for salt, words in (("", "non-empty"), ("x" * 257, "257 bytes"), ("\ud800", "UTF-8")):
        with pytest.raises(OpenAIError) as info:
            CompletionBody(model="tokenrouter", prompt="hi", cache_salt=salt).check()
        assert info.value.param == "cache_salt" and words in info.value.message
    with pytest.raises(ValidationError, match="cache_salt"):
        CompletionBody(model="tokenrouter", prompt="hi", cache_salt=7)
