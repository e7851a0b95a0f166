"""Cost-model speculation: how many tokens to draft, and whether to involve the light model.

Each branch's cost curve — milliseconds of one forward as a function of the tokens it
carries, ``ms = fixed + per_token * tokens`` — is fitted online by least squares over
the branch's recent steps (``CostCurve``; every ``BranchResult`` reports its forwards,
their padded tokens and their time); until the light model has run enough steps its curve
is the heavy one scaled by ``light_ratio``. A GPU is memory-bound: ``fixed`` dominates and a
forward of 16 x 6 tokens costs about what one of 16 costs. This CPU is compute-bound:
``per_token`` dominates and every drafted token the heavy model scores costs as much
as one it generates.

With B requests sharing a forward (each branch's mean batch; the light one never below the
heavy one's, since drafting requests reach both — except a light branch that reports
``lone_steps``, whose draft steps each session pays alone: B_light = 1), one request's share
of a block that drafts k tokens is

    cost(k) = k * (L.fixed / B_light + L.per_token) + H.fixed / B_heavy + H.per_token * (k + 1)

and, with per-token acceptance a, the block commits E(k) = (1 - a^(k+1)) / (1 - a)
tokens (the accepted drafts and the heavy model's own next token). ``k = 0`` is a
heavy-only step: cost(0) = H.fixed / B_heavy + H.per_token, E(0) = 1. The planner picks
the k in 0..max_block with the most tokens per millisecond (ties go to the smaller k),
so verify is never planned slower than heavy-only. Before the light model is in, it also
asks whether the light model pays at all: its prefill (``L`` over the prompt and the answer
so far) against the time speculation saves over the expected rest of the answer (recent
answers' lengths, ``answer_length.AnswerLengths``; ``max_tokens`` until they say otherwise).
When the saving is smaller, the block runs heavy-only steps and the question is asked again
at the next block (an answer that runs long brings the light model in late); once the light
model has run its prefill is paid, and each block's draft length alone decides.

That decision rests on the light curve and the acceptance, which only the light model's own
steps and verdicts measure: a server whose first requests all ran heavy-only steps would
keep its priors (``light_ratio``, ``prior_acceptance``) for good and never learn that
drafting pays. So until the light model is measured (its curve fitted and ``prior_weight``
verdicts in), a request whose light prefill is cheap — priced at the light prior, at most
``explore_share`` of the request's heavy-only time over ``max_tokens`` — explores: it runs
the block schedule, and its light steps and verdicts fit the curve and the acceptance. Long
prompts never explore, so a fresh server's first long prompts still weigh the prefill.
(Priced at the heavy curve instead, a 90-token chat prompt never explored on the demo pair:
its prefill exceeded a quarter of 48 heavy-only steps, the light model was never measured,
and verify ran heavy-only steps for the server's life — AIPerf, measured.)

Drafts that cost nothing to make — n-gram lookups in the prompt and the answer, the
decision cache — are planned on the heavy curve alone: d of them cost
H.fixed / B_heavy + H.per_token * (d + 1) and commit E(d) at their own acceptance
(server-wide n-gram verdicts, prior ``ngram_prior_acceptance``). When the light model is
left out (k = 0), such drafts still go to the heavy model whenever this says they pay,
so a long retrieved prompt whose answer quotes it gets copied tokens at heavy-only cost.

Route commits the light model's confident drafts unchecked, so its blocks are planned on
their own terms. With s the chance that a draft stands unchecked given the ones before it
did (server-wide route verdicts, prior ``route_prior_stand``), a block of k drafts keeps a
confident prefix J (P(J >= j) = s^j); when J < k, one heavy check scores the k - J drafts
from the first unsure one at acceptance a (an unsure draft is verified, the draft after it
must be the heavy model's own token, a confident one after that stands unless strongly
rejected, ``acceptance.accept_route``; E counts a heavy token after every check, which a
check that ends on a confident draft does not commit; a is the acceptance of all
drafts, which the confident ones lift: measured on HumanEval, planning on the lower pass rate
of the checks alone gave shorter blocks, more heavy forwards and a slower route). Every token
still passes through the heavy model once (a check ingests the unchecked tokens before it),
so the heavy per-token cost is paid on all of them and the fixed cost only when a check runs:

    cost(k) = k * (L.fixed / B_light + L.per_token) + H.per_token * (k + 1)
              + (1 - s^k) * H.fixed / B_heavy
    E(k)    = s^k * k + sum_{j<k} s^j (1 - s) * (j + (1 - a^(k-j+1)) / (1 - a))

Framework-free; the router owns one ``BranchCosts`` and feeds it every branch result.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchOp, BranchResult


@dataclass(frozen=True)
class CostConfig:
    """config.pbtxt parameters ``cost_<field>`` of the router (docs/configuration.md)."""

    model: bool = True  # cost_model: plan draft lengths from the branches' cost curves
    window: int = 512  # recent steps per branch the curve is fitted on
    min_samples: int = 24  # steps (with at least two token counts) before the curve is used
    prior_acceptance: float = 0.6  # per-token acceptance assumed before any verdict
    ngram_prior_acceptance: float = 0.5  # per-token acceptance of n-gram drafts before any verdict
    prior_weight: float = 8.0  # how many verdicts the prior is worth in a request's estimate
    decay: float = 0.98  # per block: weight kept by the server-wide acceptance counts
    light_ratio: float = 0.5  # until the light curve is fitted: light forward = this x heavy's
    route_prior_stand: float = 0.5  # route: chance a draft stands unchecked, before any route block
    explore_share: float = 0.25  # until the light model is measured: the most a request's light
    # prefill (priced as the heavy one's) may cost, as a share of its heavy-only time, to explore

    def __post_init__(self):
        if self.window < 4 or self.min_samples < 2 or not 0.0 < self.prior_acceptance < 1.0 \
                or not 0.0 < self.ngram_prior_acceptance < 1.0 \
                or self.prior_weight < 0 or not 0.0 < self.decay <= 1.0 or not 0.0 < self.light_ratio <= 4.0 \
                or not 0.0 < self.route_prior_stand < 1.0 or not 0.0 <= self.explore_share <= 1.0:
            raise ValueError(f"invalid CostConfig {self}")


@dataclass(frozen=True)
class Curve:
    """One fitted cost curve: ms of a forward carrying ``tokens`` = fixed + per_token * tokens."""

    fixed: float
    per_token: float

    def ms(self, tokens: float) -> float:
        return self.fixed + self.per_token * tokens


class CostCurve:
    """Online least-squares fit of one branch's forward cost, and its mean batch size."""

    def __init__(self, window: int = 512, min_samples: int = 24):
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=window)  # (forwards, tokens, ms)
        self.min_samples = min_samples
        self.batch = 1.0  # EWMA of sessions per forward
        self.lone_steps = False  # the branch runs one-token steps alone (BranchResult.lone_steps)
        self._fit: Curve | None = None
        self._stale = True
        self.stalls = 0  # steps the last fit left out as stalls (see _solve)

    def observe(self, forwards: int, tokens: int, ms: float, batch_size: int, lone_steps: bool = False) -> None:
        """One step: ``forwards`` forwards carrying ``tokens`` padded tokens in all took ``ms``."""
        self.lone_steps = lone_steps
        if forwards <= 0 or tokens <= 0 or ms <= 0:
            return
        self.samples.append((float(forwards), float(tokens), float(ms)))
        self.batch = 0.9 * self.batch + 0.1 * max(1, batch_size)
        self._stale = True

    @property
    def stall_ratio(self) -> float:
        """Share of the window the last fit left out as stalls."""
        return self.stalls / len(self.samples) if self.samples else 0.0

    @property
    def curve(self) -> Curve | None:
        """The fitted curve, or None until enough varied samples arrived."""
        if self._stale:
            self._fit = self._solve()
            self._stale = False
        return self._fit

    def _solve(self) -> Curve | None:
        self.stalls = 0  # no fit, no stalls: a fit that returns None must not keep the last one's count
        if len(self.samples) < self.min_samples:
            return None
        data = np.asarray(self.samples)
        if not _separable(data):
            return None
        # A stall (page-ins, a paused VM, a swapped-out stub) makes a few steps take many times
        # their usual time; least squares would bend the whole window's curve toward them (seen:
        # a handful of 3 s heavy steps clipped per_token to 0). Steps off the fit by more than
        # STALL_FACTOR either way are left out and the fit is redone until it settles; a
        # contended forward (both branches on the same cores: up to ~2.6x) stays in.
        keep = np.ones(len(data), dtype=bool)
        fit = _least_squares(data)
        for _ in range(STALL_REFITS):
            ratio = data[:, 2] / np.maximum(data[:, 0] * fit.fixed + data[:, 1] * fit.per_token, 1e-9)
            kept = (ratio <= STALL_FACTOR) & (ratio >= 1.0 / STALL_FACTOR)
            if (kept == keep).all() or kept.sum() < self.min_samples or not _separable(data[kept]):
                break
            keep = kept
            fit = _least_squares(data[keep])
        self.stalls = int(len(data) - keep.sum())
        return fit


STALL_FACTOR = 3.0  # a step taking over this many times its fitted time (or under 1/this) is a stall
STALL_REFITS = 8  # most refits after leaving stalls out (the fit settles in 2-4)


def _separable(data: np.ndarray) -> bool:
    """Whether the steps carry more than one token count per forward (else fixed and
    per-token cost cannot be told apart)."""
    return bool(np.ptp(data[:, 1] / data[:, 0]) >= 1.0)


def _least_squares(data: np.ndarray) -> Curve:
    """ms = fixed * forwards + per_token * tokens, both >= 0 (one clipped: the other alone)."""
    (fixed, per_token), *_ = np.linalg.lstsq(data[:, :2], data[:, 2], rcond=None)
    if fixed < 0:
        fixed, per_token = 0.0, float(data[:, 2].sum() / data[:, 1].sum())
    elif per_token < 0:
        fixed, per_token = float(data[:, 2].sum() / data[:, 0].sum()), 0.0
    return Curve(float(fixed), float(per_token))


def with_prior(hits: float, misses: float, prior: float, weight: float) -> float:
    """A per-token rate from hit / miss counts, with ``prior`` worth ``weight`` observations."""
    return (hits + prior * weight) / (hits + misses + weight)


class BranchCosts:
    """Both branches' curves (server-wide) and the server-wide acceptance estimate."""

    def __init__(self, config: CostConfig = CostConfig()):
        self.config = config
        self.heavy = CostCurve(config.window, config.min_samples)
        self.light = CostCurve(config.window, config.min_samples)
        self.accepted = 0.0  # decayed counts of light draft verdicts over all requests
        self.rejected = 0.0
        self.ngram_accepted = 0.0  # decayed counts of n-gram draft verdicts
        self.ngram_rejected = 0.0
        self.route_stood = 0.0  # decayed counts of route drafts that stood unchecked
        self.route_unsure = 0.0  # and of route blocks that ended on an unsure draft

    @property
    def acceptance(self) -> float:
        """Server-wide per-token acceptance (the prior until verdicts arrive)."""
        return with_prior(self.accepted, self.rejected, self.config.prior_acceptance, self.config.prior_weight)

    @property
    def ngram_acceptance(self) -> float:
        """Server-wide per-token acceptance of n-gram drafts (the prior until verdicts arrive)."""
        c = self.config
        return with_prior(self.ngram_accepted, self.ngram_rejected, c.ngram_prior_acceptance, c.prior_weight)

    @property
    def route_stand(self) -> float:
        """Server-wide chance a route draft stands unchecked (the prior until route blocks ran)."""
        c = self.config
        return with_prior(self.route_stood, self.route_unsure, c.route_prior_stand, c.prior_weight)

    def observe_route_stand(self, stood: int, unsure: int) -> None:
        d = self.config.decay
        self.route_stood = self.route_stood * d + stood
        self.route_unsure = self.route_unsure * d + unsure

    def observe_verdicts(self, accepted: int, rejected: int) -> None:
        d = self.config.decay
        self.accepted = self.accepted * d + accepted
        self.rejected = self.rejected * d + rejected

    def observe_ngram_verdicts(self, accepted: int, rejected: int) -> None:
        d = self.config.decay
        self.ngram_accepted = self.ngram_accepted * d + accepted
        self.ngram_rejected = self.ngram_rejected * d + rejected

    @property
    def light_measured(self) -> bool:
        """The light model has run enough steps for its curve and drawn enough verdicts for
        the acceptance: the cost model's light decision rests on measurements, not priors."""
        return self.light.curve is not None and self.accepted + self.rejected >= self.config.prior_weight

    def planner(self) -> "Planner | None":
        """A planner over the current curves, or None while the heavy curve is unknown. Until
        the light curve is fitted it is the heavy one scaled by ``light_ratio``: a light model
        that never ran (a fresh server whose first requests are long) is not assumed free."""
        h, light = self.heavy.curve, self.light.curve
        if h is None:
            return None
        if light is None:
            r = self.config.light_ratio
            light = Curve(h.fixed * r, h.per_token * r)
        # the light model batches the same live requests the heavy one does once they draft:
        # its own mean batch is stale while the plan keeps it idle (heavy-only steps under load);
        # a light branch with lone steps runs each session's draft step as a forward of its own
        light_batch = 1.0 if self.light.lone_steps else max(self.light.batch, self.heavy.batch)
        return Planner(h, light, self.heavy.batch, light_batch)


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens a block of k drafts commits with per-token acceptance ``acceptance``."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Planner:
    """Draft-length and light-involvement decisions over fixed curves and batch sizes."""

    heavy: Curve
    light: Curve
    heavy_batch: float = 1.0
    light_batch: float = 1.0

    def block_ms(self, k: int) -> float:
        """One request's share of a block that drafts k tokens (k = 0: one heavy-only step)."""
        heavy = self.heavy.fixed / self.heavy_batch + self.heavy.per_token * (k + 1)
        light = k * (self.light.fixed / self.light_batch + self.light.per_token)
        return heavy + light

    def tokens_per_ms(self, k: int, acceptance: float) -> float:
        return expected_tokens(k, acceptance) / self.block_ms(k)

    def best_block(self, acceptance: float, max_block: int) -> int:
        """The draft length in 0..max_block with the most expected tokens per millisecond."""
        rates = [self.tokens_per_ms(k, acceptance) for k in range(max_block + 1)]
        return int(np.argmax(rates))  # first maximum: ties go to the shorter block

    def route_rate(self, k: int, acceptance: float, stand: float) -> float:
        """Expected tokens per ms of a route block of k drafts (k = 0: one heavy-only step)."""
        if k == 0:
            return self.tokens_per_ms(0, acceptance)
        s = min(max(stand, 0.0), 0.999)
        ms = k * (self.light.fixed / self.light_batch + self.light.per_token) \
            + self.heavy.per_token * (k + 1) + (1.0 - s ** k) * self.heavy.fixed / self.heavy_batch
        tokens = s ** k * k + sum(s ** j * (1.0 - s) * (j + expected_tokens(k - j, acceptance)) for j in range(k))
        return tokens / ms

    def best_route_block(self, acceptance: float, stand: float, max_block: int) -> int:
        """The route draft length in 0..max_block with the most expected tokens per ms."""
        rates = [self.route_rate(k, acceptance, stand) for k in range(max_block + 1)]
        return int(np.argmax(rates))

    def best_draft(self, acceptance: float, max_block: int, route_stand: float | None = None) -> int:
        """The best draft length of a verify block, or of a route block when ``route_stand`` is given."""
        if route_stand is None:
            return self.best_block(acceptance, max_block)
        return self.best_route_block(acceptance, route_stand, max_block)

    def draft_rate(self, k: int, acceptance: float, route_stand: float | None = None) -> float:
        """Expected tokens per ms of that block (see ``best_draft``)."""
        if route_stand is None:
            return self.tokens_per_ms(k, acceptance)
        return self.route_rate(k, acceptance, route_stand)

    def heavy_check_ms(self, k: int) -> float:
        """One request's share of a heavy forward checking k drafts that cost nothing to make
        (n-gram / decision-cache drafts: no light forward)."""
        return self.heavy.fixed / self.heavy_batch + self.heavy.per_token * (k + 1)

    def best_free_block(self, acceptance: float, max_block: int) -> int:
        """The number of free drafts (n-gram) in 0..max_block worth one heavy check: on a
        compute-bound heavy every scored draft costs a generated token's share, on a
        memory-bound one drafts are nearly free."""
        rates = [expected_tokens(k, acceptance) / self.heavy_check_ms(k) for k in range(max_block + 1)]
        return int(np.argmax(rates))

    def light_estimate(self, prompt_tokens: int, new_tokens: int, acceptance: float, max_block: int,
                       chunk: int, route_stand: float | None = None) -> "LightEstimate":
        """What drafting saves over ``new_tokens`` against what the light prefill costs
        (``route_stand`` given: route blocks, else verify blocks)."""
        calls = -(-prompt_tokens // max(1, chunk))
        prefill = calls * self.light.fixed + self.light.per_token * prompt_tokens
        k = self.best_draft(acceptance, max_block, route_stand)
        saved_per_token = 0.0 if k == 0 else \
            1.0 / self.tokens_per_ms(0, acceptance) - 1.0 / self.draft_rate(k, acceptance, route_stand)
        return LightEstimate(new_tokens * saved_per_token, prefill, acceptance, k, rest=float(new_tokens))

    def worth_exploring(self, prompt_tokens: int, new_tokens: int, chunk: int, share: float) -> bool:
        """Whether a request may run the block schedule to measure the light model: its light
        prefill, priced at the light curve (until fitted: the heavy one times ``light_ratio``), is
        at most ``share`` of the request's heavy-only time."""
        calls = -(-prompt_tokens // max(1, chunk))
        prefill = calls * self.light.fixed + self.light.per_token * prompt_tokens
        return prefill <= share * new_tokens * self.block_ms(0)


@dataclass(frozen=True)
class LightEstimate:
    """The decision whether to involve the light model, made at every block until it is in
    (routing_stats ``light_plan_*``): expected saving against the light prefill, in ms."""

    saving_ms: float  # heavy time drafting saves over the request's max_tokens
    prefill_ms: float  # the light prefill it would pay first
    acceptance: float  # the per-token acceptance assumed
    block: int  # the draft length the saving was computed at (0: drafting never pays)
    explore: bool = False  # the light model is not measured yet: the block schedule runs to measure it
    rest: float = 0.0  # the expected tokens still to come the saving was computed over

    @property
    def pays(self) -> bool:
        return self.explore or (self.block > 0 and self.saving_ms > self.prefill_ms)


class MeteredBranch(Branch):
    """A branch whose every step feeds a ``CostCurve`` (the router wraps both branches)."""

    def __init__(self, inner: Branch, curve: CostCurve):
        self.inner = inner
        self.curve = curve
        self.name = inner.name

    async def step(self, op: BranchOp) -> BranchResult:
        result = await self.inner.step(op)
        if not op.release:
            self.curve.observe(result.forwards, result.forward_tokens, result.forward_ms, result.batch_size,
                               result.lone_steps)
        return result

    async def release(self, session_id: int) -> None:
        await self.inner.release(session_id)

    def __getattr__(self, name):  # the adapter's own attributes (model name, url, close)
        return getattr(self.inner, name)
