"""A/B split (reproducible arms) and the roll-back switch (watched override file)."""
from __future__ import annotations

import asyncio
import os

import pytest

from support.fakes import make_pair
from support.ops_helpers import PROMPTS
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.operations.ab import (
    ARM_DEFAULT,
    ARM_EXPLICIT,
    ARM_OVERRIDE,
    ARM_REQUEST,
    ARM_TOKEN,
    ab_bucket,
    choose_arm,
)
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.override import OverrideWatcher, parse_override

ROUTE = RouterDefaults(mode="route")


def test_split_is_reproducible_and_close_to_the_percentage():
    ids = [f"req-{i}" for i in range(4000)]
    arms = [choose_arm(i, 30.0) for i in ids]
    assert arms == [choose_arm(i, 30.0) for i in ids]  # same id, same arm
    share = arms.count(ARM_TOKEN) / len(arms)
    assert 0.27 < share < 0.33 and set(arms) == {ARM_TOKEN, ARM_REQUEST}
    assert all(0 <= ab_bucket(i) < 100 for i in ids[:100])
    assert choose_arm("x", 100.0) == ARM_DEFAULT and choose_arm("x", 0.0) == ARM_REQUEST


def test_admission_modes_and_precedence(tmp_path):
    ops = Operations({"ab_route_percent": "50"}, ROUTE)
    params = ROUTE.request_params({})
    seen = {}
    for i in range(200):
        adm = ops.admit(RequestInfo(f"id{i}", (1, 2), explicit_mode=False), params)
        seen.setdefault(adm.arm, set()).add(adm.params.mode)
        assert ops.admit(RequestInfo(f"id{i}", (1, 2), False), params).arm == adm.arm
    assert seen == {ARM_TOKEN: {"route"}, ARM_REQUEST: {"heavy"}}
    explicit = ops.admit(RequestInfo("id0", (1,), explicit_mode=True), ROUTE.request_params({"router_mode": "verify"}))
    assert (explicit.arm, explicit.params.mode) == (ARM_EXPLICIT, "verify")
    # no request id: keyed by the prompt, still reproducible
    a = {ops.admit(RequestInfo("", (5, 6, 7), False), params).arm for _ in range(5)}
    assert len(a) == 1
    with pytest.raises(InvalidRequest, match="ab_route_percent"):
        Operations({"ab_route_percent": "150"}, ROUTE)
    with pytest.raises(InvalidRequest, match="decision_log_path"):
        ops.admit(RequestInfo("x", (1,), False, decision_log=True), params)


def test_override_file_switches_without_restart(tmp_path):
    path = tmp_path / "override.json"
    now = [0.0]
    w = OverrideWatcher(str(path), check_ms=100, clock=lambda: now[0])
    assert w.mode() is None
    path.write_text('{"mode": "heavy"}')
    assert w.mode() is None  # not re-checked before 100 ms
    now[0] += 0.2
    assert w.mode() == "heavy"
    path.write_text('{"mode": "hevy"}')  # a typo keeps the last good state
    os.utime(path, ns=(1, 10**9))
    now[0] += 0.2
    assert w.mode() == "heavy"
    path.write_text("{}")
    now[0] += 0.2
    assert w.mode() is None
    path.write_text('{"mode": "light"}')
    now[0] += 0.2
    assert w.mode() == "light"
    path.unlink()
    now[0] += 0.2
    assert w.mode() is None
    assert parse_override("") is None and parse_override('{"mode": null}') is None
    with pytest.raises(ValueError):
        parse_override("[1]")


def test_switch_forces_new_requests_and_lets_running_ones_finish(tmp_path):
    path = tmp_path / "override.json"
    ops = Operations({"override_file": str(path), "override_check_ms": "0"}, ROUTE)
    light, heavy = make_pair()

    async def scenario():
        started = asyncio.Event()
        params = ROUTE.request_params({"max_tokens": 40})
        adm1 = ops.admit(RequestInfo("a", PROMPTS[0], False), params)

        def emit(tokens, stats, finished):
            started.set()

        running = asyncio.create_task(generate(GenerationRequest(PROMPTS[0], adm1.params), light, heavy, emit))
        await started.wait()
        path.write_text('{"mode": "heavy"}')  # operator flips the switch mid-request
        adm2 = ops.admit(RequestInfo("b", PROMPTS[1], True), ROUTE.request_params({"router_mode": "verify"}))
        s2 = await generate(GenerationRequest(PROMPTS[1], adm2.params), light, heavy, lambda *a: None)
        s1 = await running
        return adm1, s1, adm2, s2

    adm1, s1, adm2, s2 = asyncio.run(scenario())
    assert adm1.params.mode == "route" and s1.mode == "route" and s1.generated_tokens == 40
    assert (adm2.arm, adm2.params.mode) == (ARM_OVERRIDE, "heavy") and s2.light_tokens == 0
