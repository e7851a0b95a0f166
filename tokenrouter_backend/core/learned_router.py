"""The learned router: P(heavy would disagree) for a light draft, from its features.

Features of one drafted token (``feature_matrix``), all known to the router at decision
time in verify and route alike: the light top-1 probability (and its logit), the light
entropy, the token's critical class (one-hot, ``token_classes``), its position in the
answer (log1p), and the request's running acceptance (``RouteContext.acceptance``: the
share of heavy-checked drafts the heavy model agreed with so far).

The model is a logistic regression on standardized features (``tokenrouter train-router``
fits it on verify-mode decision logs); the file is JSON:

  {"format": "tokenrouter-router", "version": 1, "features": [...], "mean": [...],
   "scale": [...], "weights": [...], "bias": b, "threshold": t, "trained": {...}}

``threshold`` is the P(disagree) at or below which a draft stands unchecked (a class
policy scale divides it).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tokenrouter_backend.core.token_classes import CLASS_NAMES, TokenClass

FORMAT = "tokenrouter-router"
VERSION = 1
NUMERIC_FEATURES = ("confidence", "confidence_logit", "entropy", "log_position", "acceptance")
FEATURES = NUMERIC_FEATURES + tuple(f"class_{name}" for name in CLASS_NAMES)
_EPS = 1e-4


def feature_matrix(confidence: Sequence[float], entropy: Sequence[float], classes: Sequence[int],
                   positions: Sequence[int], acceptance: Sequence[float] | float) -> np.ndarray:
    """float64 [n, len(FEATURES)] for n drafted tokens (acceptance: per token or one value)."""
    conf = np.clip(np.asarray(confidence, np.float64), _EPS, 1 - _EPS)
    n = len(conf)
    out = np.zeros((n, len(FEATURES)))
    out[:, 0] = conf
    out[:, 1] = np.log(conf / (1 - conf))
    out[:, 2] = np.asarray(entropy, np.float64)
    out[:, 3] = np.log1p(np.asarray(positions, np.float64))
    out[:, 4] = np.broadcast_to(np.asarray(acceptance, np.float64), (n,))
    cls = np.asarray(classes, np.int64)
    out[np.arange(n), len(NUMERIC_FEATURES) + np.clip(cls, 0, len(TokenClass) - 1)] = 1.0
    return out


class RouterFileError(ValueError):
    """A router file is unreadable or does not match this version's features."""


@dataclass(frozen=True)
class LearnedRouter:
    weights: np.ndarray  # [F] on standardized features
    bias: float
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F], > 0
    threshold: float  # P(disagree) at or below which a draft stands unchecked
    trained: dict = field(default_factory=dict)  # provenance and held-out metrics

    def p_disagree(self, features: np.ndarray) -> np.ndarray:
        z = ((features - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "features": list(FEATURES),
            "mean": self.mean.tolist(), "scale": self.scale.tolist(), "weights": self.weights.tolist(),
            "bias": float(self.bias), "threshold": float(self.threshold), "trained": self.trained,
        }, indent=1)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "LearnedRouter":
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise RouterFileError(f"not a {FORMAT} version {VERSION} file "
                                  f"(format {d.get('format')!r}, version {d.get('version')!r})")
        if tuple(d.get("features", ())) != FEATURES:
            raise RouterFileError(f"router features {d.get('features')} differ from this version's {list(FEATURES)}")
        arrays = [np.asarray(d[k], np.float64) for k in ("weights", "mean", "scale")]
        if any(a.shape != (len(FEATURES),) for a in arrays) or not np.all(arrays[2] > 0):
            raise RouterFileError("router weights / mean / scale must hold one value per feature (scale > 0)")
        threshold = float(d["threshold"])
        if not 0.0 <= threshold <= 1.0 or math.isnan(threshold):
            raise RouterFileError(f"router threshold must be in [0, 1]; got {threshold}")
        return cls(arrays[0], float(d["bias"]), arrays[1], arrays[2], threshold, dict(d.get("trained", {})))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LearnedRouter":
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as exc:
            raise RouterFileError(f"cannot read router file {path}: {exc}") from exc
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, ValueError) as exc:
            raise RouterFileError(f"router file {path}: {exc}") from exc
