"""The contract between the router and a branch model (heavy or light).

One branch call ("step") on one KV session does, in order:
  1. release (if asked): drop the session and return; nothing else happens.
  2. truncate the session's KV cache to ``keep_len`` tokens (roll back rejected tokens);
     a new session starts at length 0, so its first call has keep_len == 0.
  3. extend: append ``input_ids`` (n >= 1 tokens; the engine may feed a long input in
     several forwards). The last s = ``score_last`` positions are scored (0 = all n): for
     each scored position i the model's next-token choice is returned with its
     probability and the entropy of the distribution, and for each but the last the
     probability the model gave to the *actual* next input token ``input_ids[i+1]``
     (``input_probs``, s - 1 values). A prefill asks for s = 1, a verify for its drafts + 1:
     only those positions pay for the vocabulary-sized LM head.
  4. draft: if ``draft_len`` = d > 0, ``tokens[s-1]`` is the first drafted token; it is
     fed back and the model drafts on, one forward per token, until d tokens are drafted
     or a drafted token has probability < ``min_confidence`` or entropy > ``max_entropy``
     (that token is still returned; the caller decides what to do with it).

So the result holds T = s + max(d_done - 1, 0) positions; ``tokens[s-1:]`` are the drafted
tokens. The cache afterwards holds keep_len + n + max(d_done - 1, 0) tokens (the last
drafted token is not fed yet) and ``session_len`` reports it. A new session (keep_len 0)
is refused with ``KVBudgetFull`` when the branch's KV budget cannot hold it.

With ``kv_window`` W > 0 (set on a session's first step) the session keeps the KV of its
first ``kv_sink_tokens`` positions and about its last W only; input tokens that would fall
in between are not computed (``engine/kv_window.py``): results are those of the model
reading the sequence with its middle cut out, at the same positions.

``cache_salt`` (read on a step with keep_len 0, which starts the session) keys the session's
prefix-cache blocks (``core/protocol/cache_salt.py``): a session reuses, and reports in
``reused_tokens``, only blocks made under the same salt. Sent only when set.

Choices are greedy (argmax) when ``temperature`` == 0, else sampled from the processed
distribution (temperature, top_k, top_p) with a generator seeded by (seed, position), so a
result never depends on what else was in the batch. ``dist`` holds that processed
distribution for every returned position when ``return_dist`` is set (speculative
sampling needs it), else it is empty.

``logprobs`` = k >= 0 (default -1: off) also returns raw log-probabilities (log-softmax of the
logits, unprocessed): each position's chosen token's, each scored input's next input's
(``input_logprobs``, as ``input_probs``), and with k > 0 the top k (``top_ids``/``top_logprobs``).

``processors`` (``logit_processors.py``: penalties, bias, min_tokens) change every scored row's
logits before anything else, by the tokens before its position (``history``, inputs, drafts).

Both branch models speak this contract over Triton tensors (names below), the in-process
engine speaks it with these dataclasses. Only adapters touch tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tokenrouter_backend.core.protocol.cache_salt import parse_cache_salt
from tokenrouter_backend.core.protocol.logit_processors import LogitProcessors, processors_from_input
from tokenrouter_backend.core.protocol.params import InvalidRequest


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1.0 = no nucleus cut
    seed: int = 0
    min_p: float = 0.0  # 0 = off; else tokens below min_p x the top probability are cut (after top-k / top-p)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = Sampling()


@dataclass(frozen=True)
class BranchOp:
    """One step on one session (see module docstring)."""

    session_id: int
    keep_len: int
    input_ids: tuple[int, ...]
    draft_len: int = 0
    min_confidence: float = 0.0
    max_entropy: float = math.inf
    sampling: Sampling = GREEDY
    return_dist: bool = False
    release: bool = False
    score_last: int = 0  # trailing input positions to score; 0 = all
    kv_window: int = 0  # keep only the session's sink + last ~kv_window positions; 0 = all (fixed at creation)
    cache_salt: str = ""  # the tenant of the session's prefix blocks (read at keep_len 0); "" = salt-less
    logprobs: int = -1  # raw log-probabilities returned: -1 none, 0 the tokens', k > 0 also the top k
    processors: LogitProcessors | None = None  # penalties, bias, min_tokens on every scored row; None = none

    @property
    def scored(self) -> int:
        """How many input positions the result covers (``score_last``, 0 meaning all)."""
        return self.score_last or len(self.input_ids)


@dataclass(frozen=True)
class BranchResult:
    """What a step returns. Arrays are 1-D numpy arrays of length T (``input_probs``: n-1)."""

    tokens: np.ndarray  # int32 [T]
    token_probs: np.ndarray  # float32 [T]
    entropy: np.ndarray  # float32 [T]
    input_probs: np.ndarray  # float32 [n-1]
    session_len: int
    dist: np.ndarray | None = None  # float32 [T, V] when return_dist
    forward_ms: float = 0.0  # time spent in model forwards for this step
    batch_size: int = 1  # sessions in the first batched forward this op was part of
    forward_tokens: int = 0  # padded tokens of all forwards this op took part in (cost model)
    forwards: int = 0  # how many forwards that was
    reused_tokens: int = 0  # input tokens whose KV the branch's prefix cache supplied
    # float32 [T]: top-1 minus top-2 probability of each position's processed distribution;
    # empty = unknown (a branch whose config predates the output)
    margin: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    # the branch runs one-token steps alone, never batched (engine ``lone_decode_steps``):
    # its draft steps cost every session a whole forward
    lone_steps: bool = False
    # op.logprobs >= 0: raw log-probabilities (empty otherwise): of each position's chosen
    # token [T], of each scored input's next input [n-1]; op.logprobs = k > 0: the top k [T, k]
    token_logprobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    input_logprobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    top_ids: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))
    top_logprobs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))


class BranchError(RuntimeError):
    """A branch could not serve a step (message names the branch and the reason).

    ``reason`` is what a client may be told (``failures.branch_failure``): the message itself
    may hold a server's address and stays in the server log."""

    reason = "failed"


class SessionMissing(BranchError):
    """The session was released or expired (TTL); the caller may re-prefill."""

    reason = "lost the request's session"


class KVBudgetFull(BranchError):
    """A new session does not fit the branch's KV budget now; the caller may retry later."""

    reason = "has no KV budget left"


class BranchUnreachable(BranchError):
    """The branch's server could not be reached (refused, reset, gone)."""

    reason = "is unreachable"


class BranchTimeout(BranchError):
    """A step got no answer within its deadline (a stopped or stuck branch); its session is
    released once the branch answers again (``branches/deadline.py``)."""

    reason = "did not answer in time"


# A branch error crosses Triton as a message only; the kinds a caller acts on are told
# apart by a tag the branch model appends (``encode_error``) and callers look for.
SESSION_MISSING_TAG = "SessionMissing"
KV_BUDGET_FULL_TAG = "KVBudgetFull"
_TAGGED = ((SessionMissing, SESSION_MISSING_TAG), (KVBudgetFull, KV_BUDGET_FULL_TAG))


def encode_error(exc: Exception) -> str:
    """The error message a branch model answers with ("... [SessionMissing]" for one)."""
    for kind, tag in _TAGGED:
        if isinstance(exc, kind):
            return f"{exc} [{tag}]"
    return str(exc)


def is_session_missing(message: str) -> bool:
    """Whether a branch error message (``encode_error``) reports a missing session."""
    return SESSION_MISSING_TAG in message


def decode_error(message: str) -> BranchError:
    """The exception a caller raises for a branch error message."""
    for kind, tag in _TAGGED:
        if f"[{tag}]" in message:
            return kind(message)
    return BranchError(message)


# Triton tensor names of the branch models (config.pbtxt of heavy and light).
# Every input has a leading batch dimension of 1 per request (max_batch_size > 0).
TENSOR_INPUTS = {
    "session_id": ("session_id", "TYPE_UINT64"),
    "keep_len": ("keep_len", "TYPE_INT32"),
    "input_ids": ("input_ids", "TYPE_INT32"),  # [-1], ragged
    "draft_len": ("draft_len", "TYPE_INT32"),
    "min_confidence": ("min_confidence", "TYPE_FP32"),
    "max_entropy": ("max_entropy", "TYPE_FP32"),
    "temperature": ("temperature", "TYPE_FP32"),
    "top_k": ("top_k", "TYPE_INT32"),
    "top_p": ("top_p", "TYPE_FP32"),
    "seed": ("random_seed", "TYPE_UINT64"),
    "return_dist": ("return_dist", "TYPE_BOOL"),
    "release": ("release", "TYPE_BOOL"),
    "score_last": ("score_last", "TYPE_INT32"),
    "kv_window": ("kv_window", "TYPE_INT32"),
    "cache_salt": ("cache_salt", "TYPE_STRING"),  # [1], sent only when set
    "logprobs": ("logprobs", "TYPE_INT32"),  # [1], sent only when >= 0
    "min_p": ("min_p", "TYPE_FP32"),  # [1], sent only when > 0
    "processors": ("logit_processors", "TYPE_STRING"),  # [1] JSON, sent only when active
}
SENT_WHEN_SET = frozenset({"cache_salt", "logprobs", "processors", "min_p"})  # optional in a branch config

TENSOR_OUTPUTS = {
    "tokens": "tokens",  # INT32 [-1]
    "token_probs": "token_probs",  # FP32 [-1]
    "entropy": "entropy",  # FP32 [-1]
    "input_probs": "input_probs",  # FP32 [-1]
    "session_len": "session_len",  # INT32 [1]
    "dist": "dist",  # FP32 [-1, -1]; shape [0, 0] unless return_dist
    "forward_ms": "forward_ms",  # FP32 [1]
    "batch_size": "batch_size",  # INT32 [1]
    "forward_tokens": "forward_tokens",  # INT32 [1]
    "forwards": "forwards",  # INT32 [1]
    "reused_tokens": "reused_tokens",  # INT32 [1]
    "margin": "margin",  # FP32 [-1]
    "lone_steps": "lone_steps",  # BOOL [1]
    "token_logprobs": "token_logprobs",  # FP32 [-1]; empty unless logprobs >= 0
    "input_logprobs": "input_logprobs",  # FP32 [-1]; empty unless logprobs >= 0
    "top_ids": "top_ids",  # INT32 [-1, -1]; shape [0, 0] unless logprobs > 0
    "top_logprobs": "top_logprobs",  # FP32 [-1, -1]; shape [0, 0] unless logprobs > 0
}
MAX_TOP_LOGPROBS = 20  # the most top tokens a step returns (OpenAI's top_logprobs range)


def op_to_arrays(op: BranchOp) -> dict[str, np.ndarray]:
    """BranchOp -> named numpy arrays (batch dimension 1) for a Triton request."""
    s = op.sampling
    values = {
        "session_id": np.array([[op.session_id]], dtype=np.uint64),
        "keep_len": np.array([[op.keep_len]], dtype=np.int32),
        "input_ids": np.asarray(op.input_ids, dtype=np.int32).reshape(1, -1),
        "draft_len": np.array([[op.draft_len]], dtype=np.int32),
        "min_confidence": np.array([[op.min_confidence]], dtype=np.float32),
        "max_entropy": np.array([[min(op.max_entropy, 3.0e38)]], dtype=np.float32),
        "temperature": np.array([[s.temperature]], dtype=np.float32),
        "top_k": np.array([[s.top_k]], dtype=np.int32),
        "top_p": np.array([[s.top_p]], dtype=np.float32),
        "seed": np.array([[s.seed]], dtype=np.uint64),
        "return_dist": np.array([[op.return_dist]], dtype=bool),
        "release": np.array([[op.release]], dtype=bool),
        "score_last": np.array([[op.score_last]], dtype=np.int32),
        "kv_window": np.array([[op.kv_window]], dtype=np.int32),
    }
    if s.min_p > 0:
        values["min_p"] = np.array([[s.min_p]], dtype=np.float32)
    if op.logprobs >= 0:
        values["logprobs"] = np.array([[op.logprobs]], dtype=np.int32)
    if op.processors is not None and op.processors.active:
        values["processors"] = np.array([[op.processors.to_json().encode()]], dtype=np.object_)
    if op.cache_salt:
        values["cache_salt"] = np.array([[op.cache_salt.encode("utf-8", errors="surrogatepass")]], dtype=np.object_)
    return {TENSOR_INPUTS[k][0]: v for k, v in values.items()}


def op_from_arrays(get) -> BranchOp:
    """Build a BranchOp from a tensor getter ``get(name) -> np.ndarray | None``.

    Optional inputs that are absent take the BranchOp defaults. Raises ValueError naming
    the tensor when a required one is missing.
    """

    def scalar(key, default=None):
        arr = get(TENSOR_INPUTS[key][0])
        if arr is None:
            if default is None:
                raise ValueError(f"branch input '{TENSOR_INPUTS[key][0]}' is required")
            return default
        return arr.reshape(-1)[0].item()

    ids = get(TENSOR_INPUTS["input_ids"][0])
    release = bool(scalar("release", False))
    if ids is None or (ids.size == 0 and not release):
        raise ValueError("branch input 'input_ids' needs at least one token")
    return BranchOp(
        session_id=int(scalar("session_id")),
        keep_len=int(scalar("keep_len", 0)),
        input_ids=tuple(int(t) for t in ids.reshape(-1)),
        draft_len=int(scalar("draft_len", 0)),
        min_confidence=float(scalar("min_confidence", 0.0)),
        max_entropy=float(scalar("max_entropy", math.inf)),
        sampling=Sampling(
            temperature=float(scalar("temperature", 0.0)),
            top_k=int(scalar("top_k", 0)),
            top_p=float(scalar("top_p", 1.0)),
            seed=int(scalar("seed", 0)),
            min_p=_bounded("min_p", float(scalar("min_p", 0.0)), 0.0, 1.0),
        ),
        return_dist=bool(scalar("return_dist", False)),
        release=release,
        score_last=int(scalar("score_last", 0)),
        kv_window=int(scalar("kv_window", 0)),
        cache_salt=_salt(get(TENSOR_INPUTS["cache_salt"][0])),
        logprobs=_bounded("logprobs", int(scalar("logprobs", -1)), -1, MAX_TOP_LOGPROBS),
        processors=processors_from_input(get(TENSOR_INPUTS["processors"][0])),
    )


def _bounded(name: str, value, low, high):
    if not low <= value <= high:
        raise ValueError(f"branch input '{name}' must be in [{low}, {high}]; got {value}")
    return value


def _salt(arr: np.ndarray | None) -> str:
    """The ``cache_salt`` input (absent or empty: ""); checked like the router's input."""
    if arr is None or arr.size == 0:
        return ""
    try:
        return parse_cache_salt(arr.reshape(-1)[0])
    except InvalidRequest as exc:
        raise ValueError(f"branch input {exc}") from None


def result_to_arrays(res: BranchResult) -> dict[str, np.ndarray]:
    """BranchResult -> named numpy arrays (batch dimension 1) for a Triton response."""
    dist = res.dist if res.dist is not None else np.zeros((0, 0), dtype=np.float32)
    values = {
        "tokens": res.tokens.astype(np.int32).reshape(1, -1),
        "token_probs": res.token_probs.astype(np.float32).reshape(1, -1),
        "entropy": res.entropy.astype(np.float32).reshape(1, -1),
        "input_probs": res.input_probs.astype(np.float32).reshape(1, -1),
        "session_len": np.array([[res.session_len]], dtype=np.int32),
        "dist": dist.astype(np.float32)[None, ...],
        "forward_ms": np.array([[res.forward_ms]], dtype=np.float32),
        "batch_size": np.array([[res.batch_size]], dtype=np.int32),
        "forward_tokens": np.array([[res.forward_tokens]], dtype=np.int32),
        "forwards": np.array([[res.forwards]], dtype=np.int32),
        "reused_tokens": np.array([[res.reused_tokens]], dtype=np.int32),
        "margin": np.asarray(res.margin, np.float32).reshape(1, -1),
        "lone_steps": np.array([[res.lone_steps]], dtype=bool),
        "token_logprobs": np.asarray(res.token_logprobs, np.float32).reshape(1, -1),
        "input_logprobs": np.asarray(res.input_logprobs, np.float32).reshape(1, -1),
        "top_ids": np.asarray(res.top_ids, np.int32)[None, ...],
        "top_logprobs": np.asarray(res.top_logprobs, np.float32)[None, ...],
    }
    return {TENSOR_OUTPUTS[k]: v for k, v in values.items()}


def result_from_arrays(get) -> BranchResult:
    """Build a BranchResult from ``get(name) -> np.ndarray`` (a Triton/BLS response)."""
    dist = get(TENSOR_OUTPUTS["dist"])
    dist = dist[0] if dist is not None and dist.size else None

    def optional_int(key: str) -> int:  # outputs a branch of an older repository lacks
        value = get(TENSOR_OUTPUTS[key])
        return 0 if value is None else int(value.reshape(-1)[0])

    margin = get(TENSOR_OUTPUTS["margin"])
    lone = get(TENSOR_OUTPUTS["lone_steps"])

    return BranchResult(
        tokens=get(TENSOR_OUTPUTS["tokens"]).reshape(-1),
        token_probs=get(TENSOR_OUTPUTS["token_probs"]).reshape(-1),
        entropy=get(TENSOR_OUTPUTS["entropy"]).reshape(-1),
        input_probs=get(TENSOR_OUTPUTS["input_probs"]).reshape(-1),
        session_len=int(get(TENSOR_OUTPUTS["session_len"]).reshape(-1)[0]),
        dist=dist,
        forward_ms=float(get(TENSOR_OUTPUTS["forward_ms"]).reshape(-1)[0]),
        batch_size=int(get(TENSOR_OUTPUTS["batch_size"]).reshape(-1)[0]),
        forward_tokens=optional_int("forward_tokens"),
        forwards=optional_int("forwards"),
        reused_tokens=optional_int("reused_tokens"),
        margin=np.zeros(0, np.float32) if margin is None else margin.reshape(-1).astype(np.float32, copy=False),
        lone_steps=False if lone is None else bool(lone.reshape(-1)[0]),
        token_logprobs=_floats(get(TENSOR_OUTPUTS["token_logprobs"])),
        input_logprobs=_floats(get(TENSOR_OUTPUTS["input_logprobs"])),
        top_ids=_rows(get(TENSOR_OUTPUTS["top_ids"]), np.int32),
        top_logprobs=_rows(get(TENSOR_OUTPUTS["top_logprobs"]), np.float32),
    )


def _floats(arr: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, np.float32) if arr is None else arr.reshape(-1).astype(np.float32, copy=False)


def _rows(arr: np.ndarray | None, dtype) -> np.ndarray:
    """A [1, T, k] output as [T, k] (absent or empty: [0, 0])."""
    if arr is None or arr.size == 0:
        return np.zeros((0, 0), dtype)
    return arr.reshape(arr.shape[-2], arr.shape[-1]).astype(dtype, copy=False)
