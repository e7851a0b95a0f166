"""The learned router: P(heavy would disagree) for a light draft, from its features.

Features of one drafted token (``feature_matrix``), all known to the router at decision
time in verify and route alike: the light top-1 probability (and its logit), the light
entropy, the top-1 minus top-2 probability (``margin``), the token's critical class
(one-hot, ``token_classes``), its position in the answer (log1p), and the request's
running acceptance (``RouteContext.acceptance``: the share of heavy-checked drafts the
heavy model agreed with so far).

``tokenrouter train-router`` leaves the running acceptance out (``REQUEST_STATE_FEATURES``):
its value at a draft depends on where the request's heavy checks fell, i.e. on how the
drafts were cut into blocks, and route's text must not (``acceptance.accept_route``); on
the demo pair it carried nothing the light confidence does not (docs/route_quality.md).
A file trained with it still loads and runs.

A router file lists the features it was trained on by name; the router picks those
columns of ``feature_matrix`` (so a file trained before ``margin`` existed still runs). A
feature value that is unknown at decision time (NaN: a light branch that does not report
its margin) takes the training mean, i.e. contributes nothing.

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

from tokenrouter_backend.core.signals.token_classes import CLASS_NAMES, TokenClass

FORMAT = "tokenrouter-router"
VERSION = 1
NUMERIC_FEATURES = ("confidence", "confidence_logit", "entropy", "log_position", "acceptance", "margin")
FEATURES = NUMERIC_FEATURES + tuple(f"class_{name}" for name in CLASS_NAMES)
REQUEST_STATE_FEATURES = ("acceptance",)  # not trained on: they depend on where the heavy checks fell
_EPS = 1e-4


def feature_matrix(confidence: Sequence[float], entropy: Sequence[float], classes: Sequence[int],
                   positions: Sequence[int], acceptance: Sequence[float] | float,
                   margin: Sequence[float] | None = None) -> np.ndarray:
    """float64 [n, len(FEATURES)] for n drafted tokens (acceptance: per token or one value;
    margin None = unknown: NaN)."""
    conf = np.clip(np.asarray(confidence, np.float64), _EPS, 1 - _EPS)
    n = len(conf)
    out = np.zeros((n, len(FEATURES)))
    out[:, 0] = conf
    out[:, 1] = np.log(conf / (1 - conf))
    out[:, 2] = np.asarray(entropy, np.float64)
    out[:, 3] = np.log1p(np.asarray(positions, np.float64))
    out[:, 4] = np.broadcast_to(np.asarray(acceptance, np.float64), (n,))
    out[:, 5] = np.nan if margin is None else np.asarray(margin, np.float64)[:n]
    cls = np.asarray(classes, np.int64)
    out[np.arange(n), len(NUMERIC_FEATURES) + np.clip(cls, 0, len(TokenClass) - 1)] = 1.0
    return out


def feature_columns(names: Sequence[str]) -> np.ndarray:
    """Column indices of ``names`` in ``feature_matrix``; RouterFileError names an unknown one."""
    unknown = [n for n in names if n not in FEATURES]
    if unknown or len(set(names)) != len(names) or not names:
        raise RouterFileError(f"router features must be distinct names from {list(FEATURES)}; got {list(names)}")
    return np.asarray([FEATURES.index(n) for n in names], np.int64)


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
    features: tuple[str, ...] = FEATURES  # the feature_matrix columns the weights belong to

    def __post_init__(self):
        object.__setattr__(self, "_columns", feature_columns(self.features))

    def p_disagree(self, matrix: np.ndarray) -> np.ndarray:
        """P(heavy would disagree) per row of a ``feature_matrix`` (all FEATURES columns)."""
        x = matrix[:, self._columns]
        x = np.where(np.isnan(x), self.mean, x)  # unknown -> the training mean
        z = ((x - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "features": list(self.features),
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
        names = tuple(d.get("features", ()))
        feature_columns(names)
        arrays = [np.asarray(d[k], np.float64) for k in ("weights", "mean", "scale")]
        if any(a.shape != (len(names),) for a in arrays) or not np.all(arrays[2] > 0):
            raise RouterFileError("router weights / mean / scale must hold one value per feature (scale > 0)")
        threshold = float(d["threshold"])
        if not 0.0 <= threshold <= 1.0 or math.isnan(threshold):
            raise RouterFileError(f"router threshold must be in [0, 1]; got {threshold}")
        return cls(arrays[0], float(d["bias"]), arrays[1], arrays[2], threshold, dict(d.get("trained", {})), names)

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
