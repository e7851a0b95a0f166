"""Router metrics: declarations, per-request updates adding up to routing_stats, stub metric families."""
from __future__ import annotations

import asyncio
import re
import time

import pytest

from support.fakes import StubFamily, make_pair
from support.ops_helpers import PROMPTS
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.metrics import COUNTER, HISTOGRAM, SPECS, RouterMetrics, request_updates


def test_specs_are_well_formed():
    names = [s.name for s in SPECS]
    assert len(names) == len(set(names))
    for s in SPECS:
        assert re.fullmatch(r"tokenrouter_router_[a-z0-9_]+", s.name)
        units = ("_total", "_ms", "_ratio", "_level", "_threshold", "_active", "_sessions", "_up")
        assert s.name.endswith(units), s.name
        assert (s.kind == COUNTER) == s.name.endswith("_total")
        assert set(s.labels) <= {"mode", "arm", "branch", "finish_reason", "server"}
        assert bool(s.buckets) == (s.kind == HISTOGRAM)


def run_load(ops, n=10):
    all_stats = []
    for i, prompt in enumerate(PROMPTS[:n]):
        mode = ("verify", "route", "heavy")[i % 3]
        params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 20})
        adm = ops.admit(RequestInfo(f"id{i}", prompt, explicit_mode=True), params)
        stats = asyncio.run(generate(GenerationRequest(prompt, adm.params), *make_pair(), lambda *a: None,
                                     hooks=adm.hooks))
        ops.finish(adm, stats)
        all_stats.append(stats)
    return all_stats


def wait_drained(metrics: RouterMetrics):
    deadline = time.time() + 5
    while not metrics.queue.empty() and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def total(name, **labels):
    fam = StubFamily.created[name]
    return sum(m.value for m in fam.metrics if all(m.labels.get(k) == v for k, v in labels.items()))


def test_counters_add_up_to_request_stats():
    StubFamily.created = {}
    ops = Operations({}, RouterDefaults(), StubFamily)
    stats = run_load(ops)
    wait_drained(ops.metrics)
    for mode in ("verify", "route", "heavy"):
        ss = [s for s in stats if s.mode == mode]
        assert total("tokenrouter_router_requests_total", mode=mode, arm="explicit") == len(ss)
        assert (total("tokenrouter_router_generated_tokens_total", mode=mode, branch="light")
                == sum(s.light_tokens for s in ss))
        assert (total("tokenrouter_router_generated_tokens_total", mode=mode, branch="heavy")
                == sum(s.heavy_tokens for s in ss))
        assert (total("tokenrouter_router_branch_calls_total", mode=mode, branch="heavy")
                == sum(s.heavy_calls for s in ss))
        assert total("tokenrouter_router_drafts_accepted_total", mode=mode) == sum(s.drafts_accepted for s in ss)
        assert total("tokenrouter_router_rollbacks_total", mode=mode) == sum(s.rollbacks for s in ss)
    e2e = StubFamily.created["tokenrouter_router_e2e_ms"]
    assert sorted(v for m in e2e.metrics for v in m.observations) == sorted(s.total_ms for s in stats)
    ops.close()


def test_failures_and_gauges():
    StubFamily.created = {}
    ops = Operations({}, RouterDefaults(), StubFamily)
    ops.fail("verify", "none", "invalid")
    ops.fail("verify", "none", "invalid")
    wait_drained(ops.metrics)
    assert total("tokenrouter_router_requests_total", finish_reason="invalid") == 2
    assert total("tokenrouter_router_override_active", mode="heavy") == 0
    assert total("tokenrouter_router_route_threshold") == RouterDefaults().confidence_threshold
    ops.close()


def test_recording_never_blocks():
    StubFamily.created = {}
    m = RouterMetrics(StubFamily, queue_size=1)
    m.queue.put(None)  # the recorder thread stops; nothing drains the queue now
    m._thread.join()
    stats = run_load(Operations({"metrics": "false"}, RouterDefaults()), n=1)[0]
    t0 = time.perf_counter()
    for _ in range(100):
        m.record_request(stats, "default")
    assert time.perf_counter() - t0 < 0.05 and m.dropped == 100 - m.queue.qsize()


def test_updates_label_every_metric_by_arm():
    stats = run_load(Operations({"metrics": "false"}, RouterDefaults()), n=1)[0]
    for name, labels, _ in request_updates(stats, "token"):
        assert labels["arm"] == "token" and labels["mode"] == stats.mode, name


def test_a_backend_without_histograms_gets_sum_and_count_counters():
    StubFamily.created = {}

    def no_histograms(name, description, kind):
        return None if kind == HISTOGRAM else StubFamily(name, description, kind)

    ops = Operations({}, RouterDefaults(), no_histograms)
    stats = run_load(ops, n=2)
    wait_drained(ops.metrics)
    assert "tokenrouter_router_e2e_ms" not in StubFamily.created
    assert total("tokenrouter_router_e2e_ms_count") == 2
    assert total("tokenrouter_router_e2e_ms_sum") == pytest.approx(sum(s.total_ms for s in stats))
    ops.close()
