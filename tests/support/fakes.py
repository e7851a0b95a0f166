"""Scripted branches for core tests: a deterministic toy LM that speaks the branch protocol.

``ToyLM`` gives every prefix a fixed logit vector (a hash of the last tokens), so outputs
depend on exactly which tokens precede a position: a KV bookkeeping bug (wrong keep_len,
a stale drafted token) changes the output and fails the equality tests. ``FakeBranch``
serves BranchOp steps on named sessions with the same semantics as the real engine and
counts calls.
"""
from __future__ import annotations

import zlib

import numpy as np

from tokenrouter_backend.core.loop.sampling import choose, entropy, processed_probs
from tokenrouter_backend.core.protocol.branch import Branch
from tokenrouter_backend.core.protocol.branch_protocol import BranchError, BranchOp, BranchResult, SessionMissing

VOCAB = 40


class ToyLM:
    """logits(prefix) = N(0, scale) seeded by the last ``context`` tokens; ``noise`` mixes in
    a second independent draw so a light model mostly, not always, agrees with the heavy."""

    def __init__(self, seed: int = 0, noise: float = 0.0, scale: float = 3.0, context: int = 3, vocab: int = VOCAB):
        self.seed, self.noise, self.scale, self.context, self.vocab = seed, noise, scale, context, vocab

    def _draw(self, prefix, salt):
        key = zlib.crc32(np.asarray(prefix[-self.context :], dtype=np.int64).tobytes()) ^ salt
        return np.random.default_rng(key).normal(size=self.vocab) * self.scale

    def logits(self, prefix) -> np.ndarray:
        base = self._draw(prefix, 0)
        if self.noise:
            base = base + self.noise * self._draw(prefix, 1 + self.seed)
        return base.astype(np.float32)


class FakeBranch(Branch):
    def __init__(self, name: str, lm: ToyLM, fail_with: str | None = None, margin: bool = True):
        self.name, self.lm, self.fail_with = name, lm, fail_with
        self.margin = margin  # False: answers like a branch whose config predates the margin output
        self.sessions: dict[int, list[int]] = {}
        self.ops: list[BranchOp] = []
        self.forwards = 0  # model forwards a real branch would run: one per op's input, one per further draft

    @property
    def calls(self) -> int:
        return sum(1 for op in self.ops if not op.release)

    async def step(self, op: BranchOp) -> BranchResult:
        self.ops.append(op)
        if self.fail_with:
            raise BranchError(f"{self.name}: {self.fail_with}")
        if op.release:
            self.sessions.pop(op.session_id, None)
            return BranchResult(*(np.zeros(0, np.float32),) * 4, session_len=0)
        seq = self.sessions.get(op.session_id)
        if seq is None:
            if op.keep_len:
                raise SessionMissing(f"{self.name}: session {op.session_id} missing")
            seq = []
        if op.keep_len > len(seq):
            raise BranchError(f"keep_len {op.keep_len} > session length {len(seq)}")
        seq = seq[: op.keep_len]
        self.forwards += 1
        rows, positions = [], []
        for t in op.input_ids:
            seq.append(int(t))
            rows.append(self.lm.logits(seq))
            positions.append(len(seq))
        probs = processed_probs(np.stack(rows), op.sampling)
        tokens = list(choose(probs, op.sampling, np.asarray(positions)))
        inputs = list(op.input_ids)
        input_probs = [float(probs[i, inputs[i + 1]]) for i in range(len(inputs) - 1)]
        dists = [probs[i] for i in range(len(rows))]
        p_list = [float(probs[i, tokens[i]]) for i in range(len(rows))]
        h_list = list(entropy(probs))
        cut = len(rows) - op.scored  # only the last score_last positions are returned
        tokens, p_list, h_list, dists = tokens[cut:], p_list[cut:], h_list[cut:], dists[cut:]
        input_probs = input_probs[cut:]
        drafted = 1
        while op.draft_len and drafted < op.draft_len:
            if p_list[-1] < op.min_confidence or h_list[-1] > op.max_entropy:
                break
            seq.append(int(tokens[-1]))
            self.forwards += 1
            rows.append(self.lm.logits(seq))
            pr = processed_probs(rows[-1][None], op.sampling)
            tok = int(choose(pr, op.sampling, np.asarray([len(seq)]))[0])
            tokens.append(tok)
            p_list.append(float(pr[0, tok]))
            h_list.append(float(entropy(pr)[0]))
            dists.append(pr[0])
            drafted += 1
        self.sessions[op.session_id] = seq
        top2 = np.sort(np.stack(dists), axis=-1)[:, -2:]
        logprob_fields = _raw_logprobs(np.stack(rows[cut:]), tokens, inputs[cut:], op.logprobs) \
            if op.logprobs >= 0 else {}
        return BranchResult(
            tokens=np.asarray(tokens, np.int32), token_probs=np.asarray(p_list, np.float32),
            entropy=np.asarray(h_list, np.float32), input_probs=np.asarray(input_probs, np.float32),
            session_len=len(seq), dist=np.stack(dists) if op.return_dist else None,
            margin=(top2[:, 1] - top2[:, 0]).astype(np.float32) if self.margin else np.zeros(0, np.float32),
            **logprob_fields,
        )


def _raw_logprobs(rows: np.ndarray, tokens: list, inputs: list, k: int) -> dict:
    """A fake branch's log-probability outputs (``BranchOp.logprobs``): the raw log-softmax."""
    z = rows.astype(np.float64)
    lsm = z - z.max(-1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
    r = np.arange(len(tokens))
    out = {"token_logprobs": lsm[r, tokens].astype(np.float32),
           "input_logprobs": np.asarray([lsm[i, inputs[i + 1]] for i in range(len(inputs) - 1)], np.float32)}
    if k > 0:
        top = np.argsort(-lsm, axis=-1, kind="stable")[:, :k]
        out.update(top_ids=top.astype(np.int32), top_logprobs=np.take_along_axis(lsm, top, -1).astype(np.float32))
    return out


def make_pair(noise: float = 0.6):
    """(light, heavy) fake branches: the light is the heavy LM plus noise."""
    return FakeBranch("light", ToyLM(seed=1, noise=noise)), FakeBranch("heavy", ToyLM())


# ---- pb_utils metric stubs (shared by the glue tests) ------------------------------------
class StubMetric:
    def __init__(self, family, labels, buckets):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value, self.observations = 0.0, []

    def increment(self, v):
        assert v >= 0, "counters only go up"
        self.value += v

    def set(self, v):
        self.value = v

    def observe(self, v):
        self.observations.append(v)


class StubFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: dict = {}

    def __init__(self, name, description, kind):
        assert description and kind in ("counter", "gauge", "histogram")
        self.name, self.kind, self.metrics = name, kind, []
        StubFamily.created[name] = self

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - pb_utils' spelling
        assert (buckets is not None) == (self.kind == "histogram")
        m = StubMetric(self, labels or {}, buckets)
        self.metrics.append(m)
        return m


# ---- a minimal pb_utils (tensors, errors, responses) for glue tests ------------------------
def fake_pb_module(name: str = "triton_python_backend_utils"):
    """A module with pb_utils' Tensor, TritonError, InferenceResponse and
    get_input_tensor_by_name over a dict request {input name: array}."""
    import types

    pb = types.ModuleType(name)

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class TritonError:
        def __init__(self, message):
            self.msg = message

        def message(self):
            return self.msg

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.tensors = {t.name: t.array for t in output_tensors}
            self.error = error

    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, TritonError, InferenceResponse
    pb.get_input_tensor_by_name = lambda req, name: Tensor(name, req[name]) if name in req else None
    return pb

