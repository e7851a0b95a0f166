"""Train the learned router on verify-mode decision logs (``tokenrouter train-router``).

Samples: every light draft of a greedy verify block with a heavy verdict at the same
prefix (up to and including the first rejection); label 1 = the heavy model would choose
another token. Features as ``core/learned_router.feature_matrix`` (from the logged
confidence, entropy, margin, token_class and position; the logged running acceptance is
left out, ``REQUEST_STATE_FEATURES``: route's text must not depend on where its heavy
checks fell). When some
training drafts carry no margin (logs written before it was logged, or a light branch that
does not report it) the router is trained without that feature and the report says so.
Requests are split into train and held-out sets by a hash of their request id (no request
in both). With outcome labels (``texts`` given, ``outcome_labels``) a disagreement whose
light token is a whitespace-only variant of the heavy one is a negative.

The model is an L2-regularized logistic regression fitted by Newton's method on
standardized features. Its threshold is chosen on the training split: the largest share of
drafts standing unchecked (route replay, ``replay.predict_mask``) whose predicted agreement
is at least ``target_agreement`` (default: what the confidence rule at the configured
threshold reaches there). The held-out split reports precision / recall of "heavy would
disagree" and the light-share vs agreement frontier against plain confidence thresholds.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from tokenrouter_backend.core.loop.hooks import Action, BlockRecord
from tokenrouter_backend.core.signals.learned_router import (
    FEATURES,
    REQUEST_STATE_FEATURES,
    LearnedRouter,
    feature_columns,
    feature_matrix,
)
from tokenrouter_backend.core.signals.route_gate import ClassPolicy
from tokenrouter_backend.learning.outcome_labels import outcome_disagree
from tokenrouter_backend.learning.replay import DEFAULT_GRID, Prediction, Verdicts, predict_mask

FINE_GRID = tuple(round(float(t), 3) for t in np.arange(0.05, 1.0, 0.005))  # the frontier compared against
ROUTER_GRID = (0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
DEFAULT_L2 = 1e-2
POSITIVE = {"token": "heavy would disagree", "outcome": "heavy would change the outcome"}  # what labels mean
NEWTON_STEPS = 30


@dataclass(frozen=True)
class Samples:
    x: np.ndarray  # [n, F] features
    disagree: np.ndarray  # bool [n]
    verdicts: Verdicts  # for the route replay
    classes: np.ndarray  # int [n]
    requests: np.ndarray  # request key per sample (for the split)

    def __len__(self) -> int:
        return len(self.disagree)

    def take(self, mask: np.ndarray) -> "Samples":
        v = self.verdicts
        return Samples(self.x[mask], self.disagree[mask],
                       Verdicts(v.confidence[mask], v.entropy[mask], v.agree[mask], v.heavy_prob[mask]),
                       self.classes[mask], self.requests[mask])


def sampled_drafts(r: BlockRecord) -> int:
    """How many of ``r``'s drafts are training samples: those with a heavy verdict, in a verify
    block that carries the router features (0 = none). Per-draft columns built beside
    ``collect_samples`` follow the same rule, so they line up with its rows."""
    n = len(r.heavy_agree)
    return n if r.action == Action.VERIFY and len(r.token_class) >= n else 0


def collect_samples(records: Iterable[BlockRecord], texts: Sequence[str] | None = None) -> Samples:
    """Samples from verify blocks that carry the router features (token_class per draft);
    ``texts`` (each token id's text): outcome labels, else token labels."""
    rows, agree, conf, ent, prob, cls, req, positive = [], [], [], [], [], [], [], []
    for r in records:
        n = sampled_drafts(r)
        if n == 0:
            continue
        positions = r.position + np.arange(n)
        margin = r.margin[:n] if len(r.margin) >= n else None
        rows.append(feature_matrix(r.confidence[:n], r.entropy[:n], r.token_class[:n], positions, r.acceptance,
                                   margin))
        agree += r.heavy_agree
        positive.append(outcome_disagree(r, n, texts) if texts is not None else ~np.asarray(r.heavy_agree, bool))
        conf += r.confidence[:n]
        ent += r.entropy[:n]
        prob += r.heavy_prob[:n]
        cls += r.token_class[:n]
        req += [zlib.crc32(r.request_id.encode())] * n
    agree_a = np.asarray(agree, bool)
    x = np.concatenate(rows) if rows else np.zeros((0, len(FEATURES)))
    v = Verdicts(np.asarray(conf, float), np.asarray(ent, float), agree_a, np.asarray(prob, float))
    disagree = np.concatenate(positive) if positive else np.zeros(0, bool)
    return Samples(x, disagree, v, np.asarray(cls, int), np.asarray(req, np.int64))


def split(samples: Samples, holdout: float, seed: int) -> tuple[Samples, Samples]:
    """(train, held-out) by request: a request's tokens all land on one side."""
    keys = np.unique(samples.requests)
    rng = np.random.default_rng(seed)
    held_keys = keys[rng.random(len(keys)) < holdout]
    held = np.isin(samples.requests, held_keys)
    return samples.take(~held), samples.take(held)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = DEFAULT_L2) -> tuple:
    """(weights, bias, mean, scale): L2 logistic regression on standardized x (Newton)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    reg = np.full(z.shape[1], l2 * len(x))
    reg[-1] = 0.0  # the bias is not penalized
    yf = y.astype(float)
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -40, 40)))
        grad = z.T @ (p - yf) + reg * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w[:-1], float(w[-1]), mean, scale


@dataclass(frozen=True)
class Frontier:
    confidence: list[Prediction]  # plain confidence thresholds, no class rules
    confidence_rules: list[Prediction]  # confidence thresholds with the class policy
    router: list[Prediction]  # router thresholds (P(disagree)) with the class policy
    confidence_fine: list[Prediction] = field(default_factory=list)  # FINE_GRID: what the router is compared with


def rule_masks(s: Samples, policy: ClassPolicy) -> tuple[np.ndarray, np.ndarray]:
    """(per-sample class scale, allowed at all) under the class policy."""
    scale = policy.array()[s.classes]
    return scale, np.isfinite(scale)


def frontier(s: Samples, router: LearnedRouter, policy: ClassPolicy,
             grid: Sequence[float] = DEFAULT_GRID, router_grid: Sequence[float] = ROUTER_GRID) -> Frontier:
    v, (scale, allowed) = s.verdicts, rule_masks(s, policy)
    scores = router.p_disagree(s.x)
    with np.errstate(divide="ignore", invalid="ignore"):
        conf = [predict_mask(v, v.confidence >= t, t) for t in grid]
        rules = [predict_mask(v, allowed & (v.confidence >= t * scale), t) for t in grid]
        learned = [predict_mask(v, allowed & (scores <= t / scale), t) for t in router_grid]
    fine = [predict_mask(v, v.confidence >= t, t) for t in FINE_GRID]
    return Frontier(conf, rules, learned, fine)


def unchecked_at(points: Sequence[Prediction], agreement: float) -> float:
    """Largest unchecked share among rule points reaching ``agreement`` (0 when none does)."""
    return max((p.unchecked_share for p in points if p.agreement >= agreement - 1e-12), default=0.0)


def choose_threshold(s: Samples, router: LearnedRouter, policy: ClassPolicy, target_agreement: float) -> float:
    """The router threshold with the most unchecked share at >= target agreement (on ``s``)."""
    scores = router.p_disagree(s.x)
    scale, allowed = rule_masks(s, policy)
    best, best_share = 0.0, -1.0
    for t in np.unique(np.concatenate([np.quantile(scores, np.linspace(0, 1, 201)), [0.0]])):
        with np.errstate(divide="ignore", invalid="ignore"):
            p = predict_mask(s.verdicts, allowed & (scores <= t / scale), float(t))
        if p.agreement >= target_agreement and p.unchecked_share > best_share:
            best, best_share = float(t), p.unchecked_share
    return best


@dataclass(frozen=True)
class TrainReport:
    router: LearnedRouter
    train_tokens: int
    held_tokens: int
    precision: float  # of "heavy would disagree" (score > threshold) on held-out tokens
    recall: float
    precision_half: float  # the same at P(disagree) > 0.5
    recall_half: float
    target_agreement: float
    frontier: Frontier
    notes: list[str] = field(default_factory=list)

    def held_out_text(self) -> str:
        t = self.router.trained
        return f"{self.held_tokens} held-out tokens ({t.get('held_out_requests', '?')} requests not trained on)"


def precision_recall(predicted: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    tp = float(np.sum(predicted & actual))
    return (tp / max(1, int(predicted.sum())), tp / max(1, int(actual.sum())))


def usable_features(s: Samples) -> tuple[tuple[str, ...], list[str]]:
    """The features to train on (those every training draft has, less the request-state
    ones) and a note per feature left out for lack of data."""
    known = ~np.isnan(s.x).any(axis=0)
    names = tuple(name for name, ok in zip(FEATURES, known) if ok and name not in REQUEST_STATE_FEATURES)
    notes = [f"{np.isnan(s.x[:, i]).sum()} of {len(s)} training drafts lack '{name}' (older logs, or a light "
             f"branch that does not report it): trained without it"
             for i, (name, ok) in enumerate(zip(FEATURES, known)) if not ok]
    return names, notes


def label_note(s: Samples) -> str:
    token = int((~s.verdicts.agree).sum())
    return (f"outcome labels: {token - int(s.disagree.sum())} of {token} disagreements are whitespace-only "
            "variants of the heavy token (counted as agreement)")


class NotEnoughData(ValueError):
    """The logs hold too few verdicts (or no disagreement) to train on."""


def train(records: Iterable[BlockRecord], policy: ClassPolicy, confidence_threshold: float,
          holdout: float = 0.2, seed: int = 0, l2: float = DEFAULT_L2,
          target_agreement: float | None = None, min_tokens: int = 50,
          held_out: Iterable[BlockRecord] | None = None, texts: Sequence[str] | None = None) -> TrainReport:
    """Fit, pick the threshold on the training split, evaluate on the held-out split
    (``held_out`` given: all of ``records`` train, those records are the held-out set;
    ``texts`` given: outcome labels)."""
    samples = collect_samples(records, texts)
    if held_out is None:
        train_s, held = split(samples, holdout, seed)
    else:
        train_s, held = samples, collect_samples(held_out, texts)
    if len(train_s) < min_tokens or len(held) < max(1, min_tokens // 5):
        raise NotEnoughData(f"{len(samples)} verdicts with router features ({len(train_s)} train, "
                            f"{len(held)} held out); need >= {min_tokens} train: "
                            "collect more verify-mode logs (decision_log)")
    if train_s.disagree.all() or not train_s.disagree.any():
        raise NotEnoughData("the training verdicts are all agreements or all disagreements: nothing to learn")
    names, notes = usable_features(train_s)
    if texts is not None:
        notes.append(label_note(samples))
    w, b, mean, scale = fit_logistic(train_s.x[:, feature_columns(names)], train_s.disagree, l2)
    router = LearnedRouter(w, b, mean, scale, 0.5, features=names)
    if target_agreement is None:
        t_scale, allowed = rule_masks(train_s, policy)
        v = train_s.verdicts
        target_agreement = predict_mask(v, allowed & (v.confidence >= confidence_threshold * t_scale),
                                        confidence_threshold).agreement
    threshold = choose_threshold(train_s, router, policy, target_agreement)
    predicted = router.p_disagree(held.x) > threshold
    precision, recall = precision_recall(predicted, held.disagree)
    precision_half, recall_half = precision_recall(router.p_disagree(held.x) > 0.5, held.disagree)
    trained = {"train_tokens": len(train_s), "held_out_tokens": len(held), "train_requests": int(len(np.unique(
        train_s.requests))), "held_out_requests": int(len(np.unique(held.requests))), "l2": l2, "seed": seed,
        "target_agreement": round(target_agreement, 5), "held_out_precision": round(precision, 4),
        "held_out_recall": round(recall, 4), "labels": "outcome" if texts is not None else "token"}
    router = LearnedRouter(w, b, mean, scale, threshold, trained, names)
    return TrainReport(router, len(train_s), len(held), precision, recall, precision_half, recall_half,
                       target_agreement, frontier(held, router, policy), notes)


def report_text(r: TrainReport) -> str:
    f = r.frontier
    lines = [f"trained on {r.train_tokens} drafted tokens, evaluated on {r.held_out_text()}",
             f"features: {', '.join(r.router.features)}", *(f"note: {n}" for n in r.notes),
             f"threshold P(disagree) <= {r.router.threshold:.4f} (chosen on the training split for agreement >= "
             f"{r.target_agreement:.4f})",
             f"held out, '{POSITIVE[r.router.trained.get('labels', 'token')]}' above the threshold: "
             f"precision {r.precision:.3f}, "
             f"recall {r.recall:.3f}; above 0.5: precision {r.precision_half:.3f}, recall {r.recall_half:.3f}",
             "", "held-out route replay (unchecked = light tokens the heavy model never checks)",
             f"{'rule':<22}{'bar':>8}{'unchecked':>11}{'light_share':>13}{'agreement':>11}"]
    for name, points in (("confidence", f.confidence), ("confidence+classes", f.confidence_rules),
                         ("router+classes", f.router)):
        lines += [f"{name:<22}{p.threshold:>8.3f}{p.unchecked_share:>11.3f}{p.light_share:>13.3f}{p.agreement:>11.3f}"
                  for p in points]
    lines.append("")
    for p in f.router:
        base = unchecked_at(f.confidence_fine or f.confidence, p.agreement)
        lines.append(f"router {p.threshold:.3f}: agreement {p.agreement:.3f}, unchecked {p.unchecked_share:.3f} "
                     f"vs confidence frontier {base:.3f} ({p.unchecked_share - base:+.3f}; thresholds every 0.005)")
    return "\n".join(lines)
