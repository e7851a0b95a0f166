"""Decision log: block records from the loop, JSON lines, rotation, never blocking."""
from __future__ import annotations

import dataclasses
import json
import time

from support.fakes import make_pair
from support.ops_helpers import PROMPTS, Recorder, run_one
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.operations.decision_log import DecisionLog, read_log


def test_verify_records_cover_every_token_and_agree_with_stats():
    rec = Recorder()
    out, stats = run_one(PROMPTS[0], *make_pair(), hooks=rec, router_mode="verify", max_tokens=40)
    assert sum(r.committed for r in rec.records) == len(out) == stats.generated_tokens
    assert [r.position for r in rec.records] == sorted(r.position for r in rec.records)
    verify = [r for r in rec.records if r.action == Action.VERIFY]
    assert verify and sum(r.committed_light for r in verify) == stats.drafts_accepted
    for r in verify:
        assert len(r.drafted) == len(r.confidence) == len(r.entropy)
        # leading agreements are exactly the accepted drafts, then at most one disagreement
        assert list(r.heavy_agree[: r.committed_light]) == [True] * r.committed_light
        assert len(r.heavy_agree) == min(r.committed_light + 1, len(r.drafted))
        assert all(0.0 <= p <= 1.0 for p in r.heavy_prob)
    assert sum(r.heavy_calls for r in rec.records) == stats.heavy_calls


def test_route_records_have_fallback_verdicts():
    rec = Recorder()
    out, stats = run_one(PROMPTS[1], *make_pair(noise=1.2), hooks=rec, router_mode="route",
                         confidence_threshold=0.6, max_tokens=40, stream=True)
    first, *rest = rec.records
    assert first.action == Action.HEAVY and first.committed == 1  # heavy_first (streamed): the first token
    actions = {r.action for r in rest}
    assert Action.FALLBACK in actions
    assert actions <= {Action.ACCEPT, Action.FALLBACK}
    fallbacks = [r for r in rec.records if r.action == Action.FALLBACK]
    assert any(r.heavy_agree for r in fallbacks)
    # the unsure token (after the committed prefix) is below the threshold
    for r in fallbacks:
        if len(r.drafted) > r.committed_light:
            assert r.confidence[r.committed_light] < 0.6
    assert sum(r.committed for r in rec.records) == len(out)
    assert sum(r.rolled_back for r in rec.records) == stats.rolled_back_tokens


def test_writer_writes_json_lines_and_rotates(tmp_path):
    rec = Recorder()
    run_one(PROMPTS[2], *make_pair(), hooks=rec, router_mode="verify", max_tokens=40)
    path = tmp_path / "log" / "decisions.jsonl"
    log = DecisionLog(path, max_bytes=1500, backups=2)
    for _ in range(5):
        for r in rec.records:
            assert log.submit(r)
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2"], files
    for p in path.parent.iterdir():
        assert p.stat().st_size <= 1500
        for line in p.read_text().splitlines():
            d = json.loads(line)
            assert {"request_id", "position", "action", "drafted", "confidence", "entropy", "heavy_agree",
                    "latency_ms"} <= d.keys()
    back = list(read_log(path))
    untimed = lambda r: dataclasses.replace(r, heavy_ms=0, heavy_forward_ms=0, light_ms=0, latency_ms=0)  # noqa: E731
    assert back and untimed(back[-1]) == untimed(rec.records[-1])


def test_full_queue_drops_and_counts_without_blocking(tmp_path):
    rec = Recorder()
    run_one(PROMPTS[3], *make_pair(), hooks=rec, router_mode="verify")
    log = DecisionLog(tmp_path / "d.jsonl", queue_size=2)
    log._stop.set()  # the writer exits at once: nothing drains the queue
    log._thread.join()
    t0 = time.perf_counter()
    results = [log.submit(rec.records[0]) for _ in range(50)]
    assert time.perf_counter() - t0 < 0.05
    assert results.count(True) == 2 and log.dropped == 48
