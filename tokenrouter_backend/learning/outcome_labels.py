"""R2R-style labels for ``train-router --labels outcome``: did a disagreement change the outcome?

With token labels every draft the heavy model would not have chosen is a positive. With
outcome labels (approximating R2R's "divergence that changes the answer" from verify logs)
a disagreement counts only when the light token is not a formatting variant of the heavy
model's choice: the two detokenised strings differ after removing all whitespace (" x"
vs "x", "\\n    " vs " " count as the same outcome). The heavy choice at a rejected draft
is read from the block's logged output (``output_from`` / ``output``); where it is not
there (a stop cut it) the disagreement stays a positive.
"""
from __future__ import annotations

from enum import Enum
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.loop.hooks import BlockRecord


class Labels(str, Enum):
    TOKEN = "token"  # positive = heavy's token differs
    OUTCOME = "outcome"  # positive = it differs and is not a whitespace-only variant


def heavy_choice(record: BlockRecord, i: int) -> int | None:
    """The token the answer holds where ``record.drafted[i]`` was drafted (heavy's choice at a
    rejected draft in a verify block), or None when the log does not show it."""
    if record.output_from < 0:
        return None
    at = record.position + i - record.output_from
    return int(record.output[at]) if 0 <= at < len(record.output) else None


def formatting_only(a: str, b: str) -> bool:
    """The two texts are the same once all whitespace is removed."""
    return "".join(a.split()) == "".join(b.split())


def outcome_disagree(record: BlockRecord, n: int, texts: Sequence[str]) -> np.ndarray:
    """bool [n]: the first n verdicts of ``record`` as outcome labels (True = positive)."""
    out = np.zeros(n, bool)
    for i, agree in enumerate(record.heavy_agree[:n]):
        if agree:
            continue
        light, heavy = int(record.drafted[i]), heavy_choice(record, i)
        out[i] = heavy is None or not (light < len(texts) and heavy < len(texts)
                                       and formatting_only(texts[light], texts[heavy]))
    return out
