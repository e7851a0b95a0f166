"""Request-level routing: the whole request's mode and threshold from its prompt's segments.

With ``request_policy`` on, the A/B ``request`` arm (``ab_route_percent`` < 100) runs this
policy instead of heavy-only, so that the split compares token-level routing (the
configured mode, per-token gate) with request-level routing:

  hardest segment or whole prompt >= ``request_hard_min`` -> verify
  mean segment difficulty <= ``request_easy_max``         -> route at ``request_easy_threshold``
  otherwise                                               -> route at the request's own threshold

Scores come from ``core/signals/prompt_segments.py``: rules, plus — with ``request_perplexity_tokens``
> 0 — the light model's surprise at the prompt's first tokens (``core/prompt_surprise``,
measured by the router before admission for the requests this policy decides), added to each
segment as ``PerplexityRule`` says (``request_nll_easy`` / ``_hard`` / ``_weight``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterParams
from tokenrouter_backend.core.signals.prompt_segments import PerplexityRule, PromptScore, TokenSurprise, score_prompt


@dataclass(frozen=True)
class RequestPolicyConfig:
    """config.pbtxt ``request_<field>`` (``request_policy`` itself: on / off)."""

    policy: bool = False  # request_policy: the A/B request arm runs this policy (else heavy-only)
    hard_min: float = 0.6  # hardest segment at or above -> verify
    easy_max: float = 0.2  # mean difficulty at or below -> route with the easy threshold
    easy_threshold: float = 0.5  # route confidence threshold of easy requests
    perplexity_tokens: int = 512  # prompt tokens the light model scores first; 0 = rules only
    perplexity_chunk: int = 128  # tokens per scoring forward (logits of every position: chunk x vocabulary)
    nll_easy: float = 1.0  # mean NLL (nats) at or below which a segment's perplexity adds nothing
    nll_hard: float = 3.0  # ... at or above which it adds request_nll_weight
    nll_weight: float = 0.3

    def check(self) -> "RequestPolicyConfig":
        for name in ("hard_min", "easy_max", "easy_threshold", "nll_weight"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidRequest(f"config parameter request_{name} must be in [0, 1]; got {value}")
        if not 0 <= self.perplexity_tokens <= 8192:
            raise InvalidRequest(f"config parameter request_perplexity_tokens must be in [0, 8192]; "
                                 f"got {self.perplexity_tokens}")
        if not 1 <= self.perplexity_chunk <= 512:
            raise InvalidRequest(f"config parameter request_perplexity_chunk must be in [1, 512]; "
                                 f"got {self.perplexity_chunk}")
        if not 0.0 <= self.nll_easy < self.nll_hard <= 50.0:
            raise InvalidRequest(f"config parameters request_nll_easy / request_nll_hard must satisfy "
                                 f"0 <= easy < hard <= 50; got {self.nll_easy} / {self.nll_hard}")
        return self

    @property
    def rule(self) -> PerplexityRule:
        return PerplexityRule(self.nll_easy, self.nll_hard, self.nll_weight)


def decide(config: RequestPolicyConfig, params: RouterParams, prompt_text: str,
           surprise: TokenSurprise | None = None) -> tuple[RouterParams, PromptScore]:
    """The request's params under the policy, and the score it was decided on (``surprise``:
    the light model's per-token NLL on the prompt, or None for rules only)."""
    score = score_prompt(prompt_text, surprise, config.rule)
    if max(score.hardest, score.whole) >= config.hard_min:
        return dataclasses.replace(params, mode=Mode.VERIFY), score
    if score.mean <= config.easy_max:
        return dataclasses.replace(params, mode=Mode.ROUTE, confidence_threshold=config.easy_threshold), score
    return dataclasses.replace(params, mode=Mode.ROUTE), score
