"""Operating the router: admission (roll-back switch, A/B arm), per-request hooks, recording.

``Operations`` is built once from the router's config.pbtxt parameters and holds the
server-wide pieces: metrics, decision log, override watcher, load controller and the
conservative start. ``admit`` decides a request's mode and arm and builds its hooks;
``finish``/``fail`` record it. Nothing here touches Triton: the metric families come from a
``new_family`` callable and warnings go to a ``warn`` callable, both built by the router glue.

Mode precedence: roll-back switch (override file) > client's explicit ``router_mode`` >
A/B arm (``request`` arm runs heavy) > configured ``mode``.
"""
from __future__ import annotations

import dataclasses
import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tokenrouter_backend.core.loop.hooks import Action, BlockPlan, BlockRecord
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT, Mode, Schedule
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults, RouterParams, dataclass_from_config
from tokenrouter_backend.core.signals.answer_length import AnswerLengths, LengthSignal
from tokenrouter_backend.core.signals.cost_model import BranchCosts, CostConfig, LightEstimate, with_prior
from tokenrouter_backend.core.signals.prompt_segments import TokenSurprise
from tokenrouter_backend.operations.ab import (
    ARM_EXPLICIT,
    ARM_OVERRIDE,
    ARM_REQUEST,
    BASELINE_MODE,
    choose_arm,
    request_key,
)
from tokenrouter_backend.operations.decision_log import DEFAULT_BACKUPS, DecisionLog
from tokenrouter_backend.operations.load_control import LoadConfig, LoadController
from tokenrouter_backend.operations.override import DEFAULT_CHECK_MS, OverrideWatcher
from tokenrouter_backend.operations.request_policy import RequestPolicyConfig, decide
from tokenrouter_backend.operations.threshold_control import (
    ConservativeConfig,
    ConservativeStart,
    DynamicConfig,
    DynamicThreshold,
    route_thresholds,
)

SINK_ALLOWANCE = 4  # the light branch's kv_sink_tokens default (the cost of a windowed light prefill)


@dataclass(frozen=True)
class OpsConfig:
    """Top-level operations parameters (config.pbtxt, documented in docs/operations.md)."""

    metrics: bool = True  # Prometheus router metrics
    ab_route_percent: float = 100.0  # % of requests on token-level routing; rest heavy-only
    override_file: str = ""  # roll-back switch file; "" = off
    override_check_ms: float = float(DEFAULT_CHECK_MS)  # stat() the file at most this often
    decision_log_path: str = ""  # JSON-lines decision log; "" = off
    decision_log: bool = False  # log every request (else only requests with input decision_log)
    decision_log_max_mb: float = 64.0  # rotate at this size
    decision_log_backups: int = DEFAULT_BACKUPS  # rotated files kept


@dataclass(frozen=True)
class OverloadConfig:
    """config.pbtxt ``overload_<field>``: opt-in degradation of route requests under overload."""

    degradation: bool = False  # overload_degradation: server opt-in
    relief: float = 0.2  # threshold lowered by this while the heavy branch is saturated
    floor: float = 0.5  # ... never below this


@dataclass(frozen=True)
class RequestInfo:
    """What admission needs from one request (python values, read by the glue)."""

    request_id: str
    prompt: tuple[int, ...]
    explicit_mode: bool  # the client set router_mode
    decision_log: bool | None = None  # input decision_log
    dynamic_quantile: float | None = None  # input dynamic_threshold_quantile
    prompt_text: str | None = None  # the decoded prompt (filled only when request_policy is on)
    surprise: TokenSurprise | None = None  # the light model's NLL per prompt token (wants_surprise requests)


@dataclass(frozen=True)
class Admission:
    params: RouterParams
    arm: str
    request_id: str
    hooks: "RequestHooks | None" = None


class Operations:
    def __init__(self, parameters: Mapping[str, str], defaults: RouterDefaults,
                 new_family: Callable[[str, str, str], Any] | None = None,
                 warn: Callable[[str], None] = lambda m: None):
        """``new_family``: makes the metric families (``operations/metrics.py``); None = no metrics."""
        self.config = dataclass_from_config(OpsConfig, parameters)
        self.load_config = dataclass_from_config(LoadConfig, parameters, "load_")
        self.dynamic_config = dataclass_from_config(DynamicConfig, parameters, "dynamic_threshold_")
        c = self.config
        if not 0.0 <= c.ab_route_percent <= 100.0:
            raise InvalidRequest(f"config parameter ab_route_percent must be in [0, 100]; got {c.ab_route_percent}")
        self.load = LoadController(self.load_config)
        self.cost_config = dataclass_from_config(CostConfig, parameters, "cost_")
        self.overload = dataclass_from_config(OverloadConfig, parameters, "overload_")
        self.request_policy = dataclass_from_config(RequestPolicyConfig, parameters, "request_").check()
        self.costs = BranchCosts(self.cost_config)  # the router's branches feed its curves
        self.lengths = AnswerLengths()  # recent answer lengths: the light decision's expected rest of an answer
        self.conservative = ConservativeStart(dataclass_from_config(ConservativeConfig, parameters, "conservative_"),
                                              defaults.confidence_threshold)
        self.override = OverrideWatcher(c.override_file, c.override_check_ms, warn=warn) if c.override_file else None
        self.log = (DecisionLog(c.decision_log_path, int(c.decision_log_max_mb * (1 << 20)), c.decision_log_backups)
                    if c.decision_log_path else None)
        self.metrics = None
        self._anonymous = (f"anon-{secrets.token_hex(4)}-{n}" for n in itertools.count())  # ids for id-less requests
        self._dropped_seen = {"log": 0, "metrics": 0}  # drop counts already sent to metrics
        if c.metrics and new_family is not None:
            from tokenrouter_backend.operations.metrics import RouterMetrics  # noqa: PLC0415 - only with a server
            self.metrics = RouterMetrics(new_family)

    def admit(self, info: RequestInfo, params: RouterParams) -> Admission:
        forced = self.override.mode() if self.override else None
        if forced:
            mode, arm = forced, ARM_OVERRIDE
        elif info.explicit_mode:
            mode, arm = params.mode, ARM_EXPLICIT
        else:
            arm = choose_arm(request_key(info.request_id, info.prompt), self.config.ab_route_percent)
            mode = BASELINE_MODE if arm == ARM_REQUEST else params.mode
            if arm == ARM_REQUEST and self.request_policy.policy and info.prompt_text is not None:
                params = decide(self.request_policy, params, info.prompt_text, info.surprise)[0]  # request level
                mode = params.mode
        if mode != params.mode:
            params = dataclasses.replace(params, mode=mode)
        log = self._wants_log(info.decision_log)
        quantile = self._quantile(info.dynamic_quantile)
        hooks = None
        if (log or quantile > 0 or self.load_config.control or self.conservative.config.start
                or self.cost_config.model or self.overload.degradation):
            hooks = RequestHooks(self, log, DynamicThreshold(self.dynamic_config, quantile), len(info.prompt),
                                 signal=LengthSignal.of(info.prompt, params.max_tokens))
        # the decision log tells requests apart (train-router splits by request): id-less ones get one
        return Admission(params, arm, info.request_id or next(self._anonymous), hooks)

    def wants_surprise(self, info: RequestInfo) -> bool:
        """Whether ``admit`` will decide this request by the request-level policy with the light
        model's perplexity (so the glue measures ``info.surprise`` first)."""
        if (not self.request_policy.policy or self.request_policy.perplexity_tokens <= 0 or info.explicit_mode
                or (self.override is not None and self.override.mode())):
            return False
        return choose_arm(request_key(info.request_id, info.prompt), self.config.ab_route_percent) == ARM_REQUEST

    def _wants_log(self, asked: bool | None) -> bool:
        if asked and self.log is None:
            raise InvalidRequest("decision_log needs the router parameter decision_log_path to be set")
        return self.log is not None and (asked if asked is not None else self.config.decision_log)

    def _quantile(self, asked: float | None) -> float:
        q = self.dynamic_config.quantile if asked is None else asked
        if isinstance(q, bool) or not 0.0 <= float(q) < 1.0:
            raise InvalidRequest(f"dynamic_threshold_quantile must be in [0, 1); got {q!r}")
        return float(q)

    def observe(self, record: BlockRecord) -> None:
        self.load.observe(record)
        self.conservative.observe(record)
        accepted, rejected = verdict_counts(record)
        if accepted or rejected:
            self.costs.observe_verdicts(accepted, rejected)

    def finish(self, admission: Admission, stats: RequestStats) -> None:
        if admission.hooks is not None and admission.hooks.signal is not None:
            self.lengths.observe(admission.hooks.signal, stats.generated_tokens)
        if self.metrics is not None:
            self.metrics.submit(self._request_updates(admission, stats) + self._gauge_updates())

    def fail(self, mode: Mode, arm: str, reason: str) -> None:
        if self.metrics is not None:
            from tokenrouter_backend.operations.metrics import failure_updates  # noqa: PLC0415
            self.metrics.submit(failure_updates(mode, arm, reason) + self._gauge_updates())

    def _request_updates(self, admission: Admission, stats: RequestStats) -> list:
        from tokenrouter_backend.operations.metrics import request_updates  # noqa: PLC0415
        return request_updates(stats, admission.arm)

    def _gauge_updates(self) -> list:
        forced = self.override.mode() if self.override else None
        a = self.load.acceptance
        out = [("tokenrouter_router_heavy_queue_ms", {}, self.load.queue_ms),
               ("tokenrouter_router_acceptance_ratio", {}, -1.0 if a is None else a),
               ("tokenrouter_router_load_level", {}, self.load.level if self.load_config.control else 0),
               ("tokenrouter_router_route_threshold", {}, self.conservative.floor(self.conservative.target)),
               ("tokenrouter_router_decision_log_dropped_total", {}, 0),
               ("tokenrouter_router_metric_updates_dropped_total", {}, 0)]
        out += [("tokenrouter_router_override_active", {"mode": m.value}, float(m == forced))
                for m in Mode]
        for branch, costs in ((HEAVY, self.costs.heavy), (LIGHT, self.costs.light)):
            labels, curve = {"branch": branch}, costs.curve
            out += [("tokenrouter_router_cost_fixed_ms", labels, -1.0 if curve is None else curve.fixed),
                    ("tokenrouter_router_cost_per_token_ms", labels, -1.0 if curve is None else curve.per_token),
                    ("tokenrouter_router_cost_stall_ratio", labels, costs.stall_ratio)]
        out += self._dropped_increments()
        return out

    def _dropped_increments(self) -> list:
        """Counters fed from plain ints owned by other threads: send only the increase."""
        out, seen = [], self._dropped_seen
        log_dropped = self.log.dropped if self.log else 0
        for key, name, now in (("log", "tokenrouter_router_decision_log_dropped_total", log_dropped),
                               ("metrics", "tokenrouter_router_metric_updates_dropped_total", self.metrics.dropped)):
            if now > seen[key]:
                out.append((name, {}, now - seen[key]))
                seen[key] = now
        return out

    def close(self) -> None:
        for part in (self.log, self.metrics):
            if part is not None:
                part.close()


def verdict_counts(record: BlockRecord) -> tuple[int, int]:
    """(drafts accepted, 1 if one was rejected) of a block's heavy verdicts."""
    agree = record.heavy_agree
    lead = next((i for i, a in enumerate(agree) if not a), len(agree))
    return lead, int(lead < len(agree))


@dataclass
class RequestHooks:
    """One request's ``BlockHooks``: thresholds, load and cost plan before, observers after."""

    ops: Operations
    log: bool
    dynamic: DynamicThreshold
    prompt_tokens: int = 0
    blocks: int = field(default=0)
    accepted: int = 0  # this request's draft verdicts (its acceptance estimate)
    rejected: int = 0
    ngram_accepted: int = 0  # this request's n-gram draft verdicts
    ngram_rejected: int = 0
    signal: LengthSignal | None = None  # what predicts this answer's length (AnswerLengths)
    light: LightEstimate | None = None  # the light decision: made at every block until the light model is in
    generated: int = 0  # tokens of the answer so far (after the last block)
    light_in: bool = False  # the light model has run for this request (its prefill is paid)
    route_stood: int = 0  # route: this request's drafts that stood unchecked
    route_unsure: int = 0  # and its route blocks that ended on an unsure draft

    def plan(self, params: RouterParams, block: int) -> BlockPlan:
        self.blocks += 1
        if params.mode == Mode.ROUTE:
            params = route_thresholds(params, self.ops.conservative, self.dynamic)
        plan = self.ops.load.plan(params, block)
        degraded = self._degrade(plan)  # an opted-in route request drafts on rather than adding heavy steps
        return degraded if degraded is not plan else self._cost_plan(plan)

    def _degrade(self, plan: BlockPlan) -> BlockPlan:
        """route, heavy saturated, server and request opted in: a lower threshold, down to the floor."""
        o, p = self.ops.overload, plan.params
        if not (o.degradation and p.allow_degradation and plan.mode == Mode.ROUTE and self.ops.load.saturated):
            return plan
        lowered = max(o.floor, p.confidence_threshold - o.relief)
        if lowered >= p.confidence_threshold:
            return plan
        return BlockPlan(dataclasses.replace(p, confidence_threshold=lowered), plan.block, plan.mode, degraded=True)

    def acceptance(self) -> float:
        """This request's per-token acceptance, the server-wide estimate as its prior."""
        return with_prior(self.accepted, self.rejected, self.ops.costs.acceptance, self.ops.cost_config.prior_weight)

    def route_stand(self) -> float:
        """This request's chance a route draft stands unchecked, the server-wide one as its prior."""
        return with_prior(self.route_stood, self.route_unsure, self.ops.costs.route_stand,
                          self.ops.cost_config.prior_weight)

    def ngram_acceptance(self) -> float:
        """This request's per-token n-gram acceptance, the server-wide estimate as its prior."""
        return with_prior(self.ngram_accepted, self.ngram_rejected, self.ops.costs.ngram_acceptance,
                          self.ops.cost_config.prior_weight)

    def _cost_plan(self, plan: BlockPlan) -> BlockPlan:
        """verify / route with the adaptive schedule: the draft length with the most tokens per
        unit of cost (0 = heavy-only steps). ``block_schedule: fixed`` keeps the request's block."""
        if (not self.ops.cost_config.model or plan.mode not in (Mode.VERIFY, Mode.ROUTE)
                or plan.params.block_schedule == Schedule.FIXED):
            return plan
        planner = self.ops.costs.planner()
        if planner is None:
            return plan  # curves not known yet: the block schedule decides
        p, a = plan.params, self.acceptance()
        stand = self.route_stand() if plan.mode == Mode.ROUTE else None
        if not self.light_in or self.light is None:  # until the light model is in, every block asks again
            self.light = self._light_decision(planner, p, a, stand)
        if self.light.explore:  # measuring the light model: the block schedule decides, as before any curve
            return dataclasses.replace(plan, light_estimate=self.light)
        # once in (its prefill paid, maybe by blocks planned before the curves were known), drafting
        # goes on while the draft length pays
        k = planner.best_draft(a, p.max_block_size, stand) if self.light.pays or self.light_in else 0
        copies = p.ngram.enabled or (k == 0 and p.ngram.heavy_steps)  # route: in heavy-only steps only
        free = planner.best_free_block(self.ngram_acceptance(), p.ngram.max_draft) if copies else 0
        if k == 0:  # heavy-only steps, a block per call as in heavy mode (its draft steps batch in the engine)
            return BlockPlan(p, p.block_size, Mode.HEAVY, free_drafts=free, light_estimate=self.light)
        return BlockPlan(p, min(k, plan.block) if self.ops.load_config.control else k, plan.mode, free_drafts=free,
                         light_estimate=self.light)

    def _light_decision(self, planner, p: RouterParams, acceptance: float, stand: float | None) -> LightEstimate:
        """Whether the light model pays for the rest of this answer: its prefill (the prompt and the
        answer so far) against the saving over the expected rest (``AnswerLengths``, at most
        ``max_tokens``); an unmeasured light model explores where its prefill is cheap against
        ``max_tokens`` heavy-only steps."""
        context = self.prompt_tokens + self.generated
        light_prompt = min(context, p.light_kv_window + SINK_ALLOWANCE) if p.light_kv_window \
            else context  # a windowed light model prefills sink + window at most
        rest = self.ops.lengths.expected_remaining(self.signal, self.generated, p.max_tokens) \
            if self.signal is not None else float(max(0, p.max_tokens - self.generated))
        estimate = planner.light_estimate(light_prompt, rest, acceptance, p.max_block_size,
                                          p.prefill_chunk_tokens, stand)
        # exploring measures the light model for the whole server: sized on max_tokens as ever, not
        # on the learned rest (a server of short answers would otherwise never measure it)
        horizon = max(0, p.max_tokens - self.generated)
        if not self.ops.costs.light_measured and planner.worth_exploring(
                light_prompt, horizon, p.prefill_chunk_tokens, self.ops.cost_config.explore_share):
            estimate = dataclasses.replace(estimate, explore=True)
        return estimate

    def after_block(self, record: BlockRecord) -> None:
        self.generated = record.position + record.committed
        self.light_in = self.light_in or record.light_ms > 0
        accepted, rejected = verdict_counts(record)
        self.accepted += accepted
        self.rejected += rejected
        if record.action in (Action.ACCEPT, Action.FALLBACK) and record.drafted:
            stood, unsure = record.committed_light, int(record.committed_light < len(record.drafted))
            self.route_stood += stood
            self.route_unsure += unsure
            self.ops.costs.observe_route_stand(stood, unsure)
        if record.ngram_drafted:
            ngram_rejected = int(record.ngram_accepted < record.ngram_drafted)
            self.ngram_accepted += record.ngram_accepted
            self.ngram_rejected += ngram_rejected
            self.ops.costs.observe_ngram_verdicts(record.ngram_accepted, ngram_rejected)
        self.dynamic.observe(record)
        self.ops.observe(record)
        if self.log and self.ops.log is not None:
            self.ops.log.submit(record)
