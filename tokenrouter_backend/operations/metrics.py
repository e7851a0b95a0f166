"""Every router-side Prometheus metric, declared once (Triton custom metrics, port 8002).

The block loop only fills ``RequestStats``; at request end the router glue hands the
stats to ``RouterMetrics.record_request``, which queues them. A recorder thread turns
them into counter increments / histogram observations on Triton's metric families (each
of those is an IPC to the server process), so recording never blocks a request. The
families come from a plain ``new_family(name, description, kind)`` callable the router
glue builds (``serving/backend.py``), so this module runs without Triton.

Labels are low-cardinality: ``mode`` (heavy|light|verify|route), ``arm`` (see
``ab.ARMS``), ``branch`` (heavy|light), ``finish_reason`` (length|end_id|stop_words|
error|cancelled|invalid), ``server`` (a heavy pool's ``host:port``, one per listed
server). Branch-side metrics (batch sizes, forward latency, KV sessions and bytes) belong
to the branch models (``serving/branch_model.py``), not here.
Names end in their unit (``_ms``, ``_tokens``) or ``_total`` for counts.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT, Source

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
LATENCY_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
OVERHEAD_BUCKETS_MS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)
QUEUE_SIZE = 10_000  # pending metric updates before new ones are dropped (counted)
MODE_ARM = ("mode", "arm")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    description: str
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


SPECS = (
    MetricSpec("tokenrouter_router_requests_total", "Requests finished, by finish reason", COUNTER,
               MODE_ARM + ("finish_reason",)),
    MetricSpec("tokenrouter_router_generated_tokens_total", "Generated tokens by the branch that produced them",
               COUNTER, MODE_ARM + ("branch",)),
    MetricSpec("tokenrouter_router_prompt_tokens_total", "Prompt tokens of finished requests", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_drafts_proposed_total", "Light tokens drafted (verify, route)", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_drafts_accepted_total",
               "Drafted light tokens that stood (verify: accepted by heavy; route: committed)", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_ngram_drafts_proposed_total", "n-gram drafts (copied from earlier text) "
               "checked by the heavy model", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_ngram_drafts_accepted_total", "n-gram drafts that stood", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_light_copy_drafts_proposed_total", "Copied tokens route's light model read in "
               "one forward instead of drafting them (light_copies)", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_light_copy_drafts_accepted_total", "Of those, tokens equal to the light "
               "model's own greedy choice (drafts without a forward each)", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_answer_cache_hits_total", "Requests whose prompt the decision cache had "
               "answered before (hit rate: / requests_total)", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_answer_drafts_accepted_total", "Drafts from the decision cache's earlier "
               "answer that stood", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_reused_prompt_tokens_total", "Input tokens whose KV a branch's prefix cache "
               "supplied", COUNTER, MODE_ARM + ("branch",)),
    MetricSpec("tokenrouter_router_branch_calls_total", "Branch calls (BLS) made by the router", COUNTER,
               MODE_ARM + ("branch",)),
    MetricSpec("tokenrouter_router_branch_wait_ms_total",
               "Milliseconds requests spent awaiting a branch (hop + queue + forward)", COUNTER,
               MODE_ARM + ("branch",)),
    MetricSpec("tokenrouter_router_reprefills_total",
               "Branch sessions that vanished mid-request and were prefilled again", COUNTER, ("mode", "arm")),
    MetricSpec("tokenrouter_router_heavy_only_blocks_total",
               "verify/route blocks the cost model ran on the heavy model alone", COUNTER, ("mode", "arm")),
    MetricSpec("tokenrouter_router_light_skipped_total",
               "verify/route requests the cost model kept away from the light model", COUNTER, ("mode", "arm")),
    MetricSpec("tokenrouter_router_light_explored_total",
               "verify/route requests that ran the block schedule to measure a not yet measured light model",
               COUNTER, ("mode", "arm")),
    MetricSpec("tokenrouter_router_degraded_blocks_total",
               "route blocks run with the overload-lowered threshold (allow_degradation)", COUNTER, ("mode", "arm")),
    MetricSpec("tokenrouter_router_rollbacks_total", "Route rollbacks (heavy rejected a committed light token)",
               COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_rolled_back_tokens_total", "Tokens removed by route rollbacks", COUNTER, MODE_ARM),
    MetricSpec("tokenrouter_router_overhead_ms", "Per-request router time not spent awaiting a branch",
               HISTOGRAM, MODE_ARM, OVERHEAD_BUCKETS_MS),
    MetricSpec("tokenrouter_router_ttft_ms", "Time to first streamed token", HISTOGRAM, MODE_ARM, LATENCY_BUCKETS_MS),
    MetricSpec("tokenrouter_router_e2e_ms", "Request latency inside the router, end to end", HISTOGRAM, MODE_ARM,
               LATENCY_BUCKETS_MS),
    MetricSpec("tokenrouter_router_decision_log_dropped_total", "Decision-log records dropped (writer queue full)",
               COUNTER, ()),
    MetricSpec("tokenrouter_router_metric_updates_dropped_total", "Metric updates dropped (recorder queue full)",
               COUNTER, ()),
    MetricSpec("tokenrouter_router_heavy_queue_ms", "EWMA of heavy call wall time minus its forward time",
               GAUGE, ()),
    MetricSpec("tokenrouter_router_acceptance_ratio", "EWMA of drafts accepted / drafted (verify blocks)", GAUGE, ()),
    MetricSpec("tokenrouter_router_load_level", "Load control level: 0 normal, 1 block capped, 2 relieved/suspended",
               GAUGE, ()),
    MetricSpec("tokenrouter_router_route_threshold", "Route confidence threshold in force (conservative start)",
               GAUGE, ()),
    MetricSpec("tokenrouter_router_override_active", "1 while the roll-back switch forces a mode", GAUGE, ("mode",)),
    MetricSpec("tokenrouter_router_heavy_server_calls_total", "Heavy branch calls sent to each heavy server (pool)",
               COUNTER, ("server",)),
    MetricSpec("tokenrouter_router_heavy_server_sessions_total", "Heavy sessions placed on each heavy server (pool)",
               COUNTER, ("server",)),
    MetricSpec("tokenrouter_router_heavy_server_failovers_total",
               "Heavy sessions moved away from a heavy server that could not be reached (pool)", COUNTER, ("server",)),
    MetricSpec("tokenrouter_router_heavy_server_live_sessions", "Heavy sessions pinned to each heavy server (pool)",
               GAUGE, ("server",)),
    MetricSpec("tokenrouter_router_heavy_server_up", "1 while a heavy server of the pool counts as up, 0 while down",
               GAUGE, ("server",)),
    MetricSpec("tokenrouter_router_cost_fixed_ms", "Fitted fixed cost of one branch forward (ms; -1 = not fitted yet)",
               GAUGE, ("branch",)),
    MetricSpec("tokenrouter_router_cost_per_token_ms",
               "Fitted cost per padded token of a branch forward (ms; -1 = not fitted yet)", GAUGE, ("branch",)),
    MetricSpec("tokenrouter_router_cost_stall_ratio",
               "Share of a branch's fit window left out of its cost curve as stalls "
               "(over 3x or under 1/3 of the fitted time)",
               GAUGE, ("branch",)),
)
SPEC_BY_NAME = {s.name: s for s in SPECS}

Update = tuple  # (metric name, labels dict, value)


def request_updates(stats: RequestStats, arm: str) -> list[Update]:
    """The metric updates one finished request contributes (pure; what the test sums)."""
    base = {"mode": stats.mode, "arm": arm}
    finished = {**base, "finish_reason": stats.finish_reason or "length"}
    out: list[Update] = [("tokenrouter_router_requests_total", finished, 1)]
    for branch, tokens, calls, ms in ((LIGHT, stats.light_tokens, stats.light_calls, stats.light_ms),
                                      (HEAVY, stats.heavy_tokens, stats.heavy_calls, stats.heavy_ms)):
        labels = {**base, "branch": branch}
        out += [("tokenrouter_router_generated_tokens_total", labels, tokens),
                ("tokenrouter_router_branch_calls_total", labels, calls),
                ("tokenrouter_router_branch_wait_ms_total", labels, ms)]
    out += [
        ("tokenrouter_router_prompt_tokens_total", base, stats.prompt_tokens),
        ("tokenrouter_router_drafts_proposed_total", base, stats.drafts_proposed),
        ("tokenrouter_router_drafts_accepted_total", base, stats.drafts_accepted),
        ("tokenrouter_router_generated_tokens_total", {**base, "branch": Source.NGRAM.value}, stats.ngram_tokens),
        ("tokenrouter_router_ngram_drafts_proposed_total", base, stats.ngram_drafts_proposed),
        ("tokenrouter_router_ngram_drafts_accepted_total", base, stats.ngram_drafts_accepted),
        ("tokenrouter_router_light_copy_drafts_proposed_total", base, stats.light_copy_drafts_proposed),
        ("tokenrouter_router_light_copy_drafts_accepted_total", base, stats.light_copy_drafts_accepted),
        ("tokenrouter_router_answer_cache_hits_total", base, int(stats.answer_cache_hit)),
        ("tokenrouter_router_answer_drafts_accepted_total", base, stats.answer_drafts_accepted),
        ("tokenrouter_router_reused_prompt_tokens_total", {**base, "branch": HEAVY}, stats.heavy_reused_tokens),
        ("tokenrouter_router_reused_prompt_tokens_total", {**base, "branch": LIGHT}, stats.light_reused_tokens),
        ("tokenrouter_router_rollbacks_total", base, stats.rollbacks),
        ("tokenrouter_router_reprefills_total", base, stats.reprefills),
        ("tokenrouter_router_heavy_only_blocks_total", base, stats.heavy_only_blocks),
        ("tokenrouter_router_light_skipped_total", base, int(stats.light_skipped)),
        ("tokenrouter_router_light_explored_total", base, int(stats.light_plan_explored)),
        ("tokenrouter_router_degraded_blocks_total", base, stats.degraded_blocks),
        ("tokenrouter_router_rolled_back_tokens_total", base, stats.rolled_back_tokens),
        ("tokenrouter_router_overhead_ms", base, stats.router_overhead_ms),
        ("tokenrouter_router_ttft_ms", base, stats.first_token_ms),
        ("tokenrouter_router_e2e_ms", base, stats.total_ms),
    ]
    return out


def pool_updates(calls: dict[str, int], opened: dict[str, int], failovers: dict[str, int],
                 live: dict[str, int], up: dict[str, bool]) -> list[Update]:
    """A heavy pool's per-server increments (since the last report) and gauges (now)."""
    out: list[Update] = []
    for name, counts in (("tokenrouter_router_heavy_server_calls_total", calls),
                         ("tokenrouter_router_heavy_server_sessions_total", opened),
                         ("tokenrouter_router_heavy_server_failovers_total", failovers)):
        out += [(name, {"server": server}, n) for server, n in counts.items()]
    out += [("tokenrouter_router_heavy_server_live_sessions", {"server": s}, n) for s, n in live.items()]
    out += [("tokenrouter_router_heavy_server_up", {"server": s}, int(ok)) for s, ok in up.items()]
    return out


def failure_updates(mode: str, arm: str, reason: str) -> list[Update]:
    """``mode``: a Mode (or its value); labels carry the plain value."""
    return [("tokenrouter_router_requests_total", {"mode": str(mode), "arm": arm, "finish_reason": reason}, 1)]


class SumCount:
    """Histogram stand-in for python backends without HISTOGRAM: ``<name>_sum``/``_count`` counters.

    Shared with the branch models' metrics (serving/branch_model.py).
    """

    def __init__(self, total, count):
        self.total, self.count = total, count

    def observe(self, value: float) -> None:
        self.total.increment(value)
        self.count.increment(1)


# (name, description, kind: COUNTER | GAUGE | HISTOGRAM) -> a metric family; None for a
# kind the backend lacks (a histogram then becomes <name>_sum / <name>_count counters)
NewFamily = Callable[[str, str, str], Any]


class RouterMetrics:
    """Families created once at model start; updates applied by a recorder thread."""

    def __init__(self, new_family: NewFamily, queue_size: int = QUEUE_SIZE):
        self.new_family = new_family
        self.families = {spec.name: self._family(spec) for spec in SPECS}
        self.metrics: dict = {}  # (name, sorted labels) -> Metric, created on first use
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="tokenrouter-metrics", daemon=True)
        self._thread.start()

    def _family(self, spec: MetricSpec):
        new = self.new_family
        family = new(spec.name, spec.description, spec.kind)
        if family is None and spec.kind == HISTOGRAM:
            return (new(spec.name + "_sum", spec.description + " (sum)", COUNTER),
                    new(spec.name + "_count", spec.description + " (count)", COUNTER))
        return family

    def submit(self, updates: list[Update]) -> None:
        """Queue updates; never blocks (dropped and counted when the queue is full)."""
        try:
            self.queue.put_nowait(updates)
        except queue.Full:
            self.dropped += 1

    def record_request(self, stats: RequestStats, arm: str) -> None:
        self.submit(request_updates(stats, arm))

    def close(self, timeout_s: float = 5.0) -> None:
        self.queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            updates = self.queue.get()
            if updates is None:
                return
            for name, labels, value in updates:
                try:
                    self._apply(name, labels, value)
                except Exception:  # noqa: BLE001 - a metric must never take the router down
                    pass

    def _apply(self, name: str, labels: dict, value: float) -> None:
        spec = SPEC_BY_NAME[name]
        key = (name, tuple(sorted(labels.items())))
        metric = self.metrics.get(key)
        if metric is None:
            metric = self.metrics[key] = self._metric(spec, labels)
        if spec.kind == COUNTER:
            if value:
                metric.increment(float(value))
        elif spec.kind == GAUGE:
            metric.set(float(value))
        else:
            metric.observe(float(value))

    def _metric(self, spec: MetricSpec, labels: dict):
        family = self.families[spec.name]
        if isinstance(family, tuple):
            return SumCount(family[0].Metric(labels=labels), family[1].Metric(labels=labels))
        if spec.kind == HISTOGRAM:
            return family.Metric(labels=labels, buckets=list(spec.buckets))
        return family.Metric(labels=labels)
