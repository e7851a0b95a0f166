"""Per-request routing statistics: what each branch did and where the time went."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass
class RequestStats:
    """Counters of one request; ``to_json`` is the ``routing_stats`` output.

    The cache-reuse fields (``answer_*``, ``*_reused_tokens``) count reuse under the request's
    own ``cache_salt`` only; what the others can tell about other requests: docs/security.md,
    "Tenants"."""

    mode: str = ""  # the request's Mode value (plain str: this is the wire format)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    light_tokens: int = 0  # generated tokens that came from the light model
    heavy_tokens: int = 0  # generated tokens the heavy model produced itself
    ngram_tokens: int = 0  # generated tokens that were n-gram drafts (copied text the heavy model accepted)
    light_calls: int = 0
    heavy_calls: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    verify_blocks: int = 0  # blocks in which the heavy model checked drafts
    rollbacks: int = 0
    rolled_back_tokens: int = 0
    light_ms: float = 0.0  # time awaiting the light branch (hop + queue + compute)
    heavy_ms: float = 0.0
    light_forward_ms: float = 0.0  # compute inside the light branch
    heavy_forward_ms: float = 0.0
    router_overhead_ms: float = 0.0  # total - time awaiting branches
    first_token_ms: float = 0.0
    queue_ms: float = 0.0  # phases: waiting for admission (KV budget, concurrency cap) before the loop began
    heavy_first_ms: float = 0.0  # the heavy session's first step: the prompt's prefill (+ drafts it checked)
    light_first_ms: float = 0.0  # the light session's first step: its prefill + first drafts (0 = never opened)
    light_start_ms: float = 0.0  # when that step began, from the loop's start (0 = never)
    vouch_ms: float = 0.0  # route: heavy forwards that vouched for the answer's unchecked ending
    emit_ms: float = 0.0  # awaiting the response sender (detokenization runs in postprocessing)
    total_ms: float = 0.0
    finish_reason: str = ""
    stop_trim_chars: int = 0  # characters of the last kept tokens' text a stop string began in
    reprefills: int = 0  # branch sessions that vanished mid-request (TTL) and were rebuilt
    reprefill_tokens: int = 0  # cached tokens those rebuilds had to send again
    heavy_only_blocks: int = 0  # verify/route blocks the cost model ran on the heavy model alone
    light_skipped: bool = False  # the cost model kept the light model out of this request
    light_plan_saving_ms: float = 0.0  # cost model, at each block until the light model is in: what drafting would save
    light_plan_prefill_ms: float = 0.0  # against what the light prefill would cost (0 = not planned)
    light_plan_rest: float = 0.0  # over this many expected tokens still to come (recent answers' lengths)
    light_plan_acceptance: float = 0.0  # the per-token acceptance it assumed
    light_plan_explored: bool = False  # the light model was not measured yet: this request ran the block schedule
    degraded_blocks: int = 0  # route blocks run with the overload-lowered threshold (allow_degradation)
    degraded_threshold: float = 0.0  # the lowest such threshold (0 = never degraded)
    heavy_reused_tokens: int = 0  # input tokens whose KV the heavy branch's prefix cache supplied
    light_reused_tokens: int = 0  # and the light branch's
    ngram_blocks: int = 0  # blocks whose drafts were n-gram copies (no light forward)
    ngram_drafts_proposed: int = 0  # n-gram drafts checked by the heavy model
    ngram_drafts_accepted: int = 0  # of those, how many stood
    light_copy_blocks: int = 0  # route blocks whose light drafts began as an n-gram copy the light model read
    light_copy_drafts_proposed: int = 0  # copied tokens the light model read
    light_copy_drafts_accepted: int = 0  # of those, how many were its own greedy choice (drafts without a forward each)
    answer_cache_hit: bool = False  # the decision cache held an earlier answer to this prompt
    answer_drafts_proposed: int = 0  # drafts taken from that answer, checked by the heavy model
    answer_drafts_accepted: int = 0  # of those, how many stood
    prompt_nll: float = -1.0  # request-level routing: light model's mean NLL (nats) on the prompt; -1 = not measured
    prompt_nll_tokens: int = 0  # prompt tokens that mean covers
    prompt_score_ms: float = 0.0  # time the light model took to score them (before the first block)
    token_kinds: str = ""  # routing_trace.Kind per generated token (not in to_dict: show_routing adds runs)

    @property
    def light_share(self) -> float:
        return self.light_tokens / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean drafts accepted per verified block."""
        return self.drafts_accepted / self.verify_blocks if self.verify_blocks else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("token_kinds")
        d["light_share"] = round(self.light_share, 4)
        d["mean_accepted"] = round(self.mean_accepted, 3)
        per_token = self.heavy_calls / self.generated_tokens if self.generated_tokens else 0.0
        d["heavy_calls_per_token"] = round(per_token, 4)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))
