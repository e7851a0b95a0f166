"""Request-level routing: the whole request's mode and threshold from its prompt's segments.

With ``request_policy`` on, the A/B ``request`` arm (``ab_route_percent`` < 100) runs this
policy instead of heavy-only, so that the split compares token-level routing (the
configured mode, per-token gate) with request-level routing:

  hardest segment or whole prompt >= ``request_hard_min`` -> verify
  mean segment difficulty <= ``request_easy_max``         -> route at ``request_easy_threshold``
  otherwise                                               -> route at the request's own threshold

Scores come from ``core/prompt_segments.py`` (rules; not the light model's perplexity).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenrouter_backend.core.names import Mode
from tokenrouter_backend.core.params import InvalidRequest, RouterParams
from tokenrouter_backend.core.prompt_segments import PromptScore, score_prompt


@dataclass(frozen=True)
class RequestPolicyConfig:
    """config.pbtxt ``request_<field>`` (``request_policy`` itself: on / off)."""

    policy: bool = False  # request_policy: the A/B request arm runs this policy (else heavy-only)
    hard_min: float = 0.6  # hardest segment at or above -> verify
    easy_max: float = 0.2  # mean difficulty at or below -> route with the easy threshold
    easy_threshold: float = 0.5  # route confidence threshold of easy requests

    def check(self) -> "RequestPolicyConfig":
        for name in ("hard_min", "easy_max", "easy_threshold"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidRequest(f"config parameter request_{name} must be in [0, 1]; got {value}")
        return self


def decide(config: RequestPolicyConfig, params: RouterParams, prompt_text: str) -> tuple[RouterParams, PromptScore]:
    """The request's params under the policy, and the score it was decided on."""
    score = score_prompt(prompt_text)
    if max(score.hardest, score.whole) >= config.hard_min:
        return dataclasses.replace(params, mode=Mode.VERIFY), score
    if score.mean <= config.easy_max:
        return dataclasses.replace(params, mode=Mode.ROUTE, confidence_threshold=config.easy_threshold), score
    return dataclasses.replace(params, mode=Mode.ROUTE), score
