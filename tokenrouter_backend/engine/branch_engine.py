"""Executes ``BranchOp`` steps (see ``branch_protocol``) with batched forwards over KV sessions.

``BranchEngine.run(ops)`` serves every op Triton handed one ``execute()``: releases, then
truncation, then batched forwards over the ops' new tokens (past left-padded, new tokens
right-padded, per-row position ids) of at most ``max_forward_tokens`` padded tokens each —
short ops share a forward, a long prompt is fed alone in chunks, so one forward's
activations stay bounded — then batched one-token forwards for the ops still drafting.
With ``lone_decode_steps`` (a model whose single-row kernel path differs: ``min_rows`` > 1)
every forward of one session feeding one token runs alone and unpadded instead, and no
one-token row joins a batch, so each session still gets the same logits at any load.
The LM head runs only on the positions an op asks for (``score_last``: a prefill needs its
last position, a verify its drafts). One op's failure (bad keep_len, missing session, too
long, KV budget full) fails only that op. With ``turns`` (``core_turns.CoreTurns``) each
forward waits its turn on the CPU cores; the forward's own time excludes that wait.
Framework-free: the model is anything with ``info`` (``ModelInfo``) and ``forward`` like
``OnnxCausalLM`` (or ``torch_lm.TorchCausalLM``); a model with ``kv_arrays`` keeps the
store's KV buffers in that array kind (torch tensors on its device), else numpy.
How ops become forwards: ``forward_plan``; logits into tokens and results: ``step_scores``.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from tokenrouter_backend.core.protocol.branch_protocol import BranchError, BranchOp, BranchResult
from tokenrouter_backend.engine import kv_window
from tokenrouter_backend.engine.core_turns import CoreTurns
from tokenrouter_backend.engine.forward_plan import OpWork, check_op, next_forward, session_waves
from tokenrouter_backend.engine.kv_session import KVShape, Session
from tokenrouter_backend.engine.kv_store import KVStore
from tokenrouter_backend.engine.prefix_cache import DEFAULT_BLOCK_TOKENS, PrefixCache
from tokenrouter_backend.engine.step_scores import empty_result, op_result, score_rows


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of one branch engine (config.pbtxt parameters of heavy/light)."""

    max_draft_len: int = 16  # longest draft one step may ask for (bounds a call's latency)
    session_ttl_s: float = 600.0  # an idle session is dropped after this (vanished clients)
    kv_cache_budget_mb: float = 2048.0  # new sessions are refused above this much KV memory
    max_batch: int = 32  # ops per batched forward; more are run in further forwards
    max_forward_tokens: int = 512  # padded tokens (rows x longest) one forward may carry
    # a model with min_rows > 1: one session feeding one token runs alone and unpadded (the
    # single-row kernel path), never inside a batch; everything else stays padded and batched
    lone_decode_steps: bool = True
    prefix_cache: bool = True  # share KV blocks of repeated prefixes between sessions
    prefix_cache_block_tokens: int = DEFAULT_BLOCK_TOKENS  # positions per shared block
    kv_sink_tokens: int = kv_window.DEFAULT_SINK_TOKENS  # leading positions a step's kv_window always keeps

    def __post_init__(self):
        if (self.max_draft_len < 0 or self.max_batch < 1 or self.session_ttl_s <= 0 or self.kv_cache_budget_mb <= 0
                or self.max_forward_tokens < 1 or self.prefix_cache_block_tokens < 1 or self.kv_sink_tokens < 0):
            raise ValueError(f"invalid EngineConfig {self}")

    @property
    def budget_bytes(self) -> int:
        return int(self.kv_cache_budget_mb * (1 << 20))


class BranchEngine:
    """Runs lists of ``BranchOp`` on one model and its KV store."""

    def __init__(self, model, store: KVStore | None = None, config: EngineConfig = EngineConfig(),
                 name: str = "branch", turns: CoreTurns | None = None):
        self.model = model
        self.turns = turns  # forwards take turns on the cores with the other branch (None: never wait)
        self.config = config
        self.name = name
        self.max_len = model.info.max_position_embeddings
        # lone steps only change anything for a model whose single-row path differs (min_rows > 1)
        self.lone = config.lone_decode_steps and getattr(model.info, "min_rows", 1) > 1
        cache = PrefixCache(config.prefix_cache_block_tokens) if config.prefix_cache else None
        self.store = store or KVStore(KVShape.from_info(model.info), config.session_ttl_s,
                                      config.budget_bytes, name=name,
                                      arrays=getattr(model, "kv_arrays", None), prefix_cache=cache)
        self.last_batch_sizes: list[int] = []  # batch size of each forward of the last run()
        self.last_forward_ms: list[float] = []  # and its duration
        self.last_forward_tokens: list[int] = []  # and its padded token count
        self.largest_forward_tokens = 0  # most padded tokens any forward carried (observability)

    # ---- public ------------------------------------------------------------------
    def run(self, ops: list[BranchOp]) -> list[BranchResult | Exception]:
        """Serve ops; result i is the BranchResult or the exception of ops[i]."""
        with self.turns.run() if self.turns is not None else nullcontext():
            return self._run(ops)

    def _run(self, ops: list[BranchOp]) -> list[BranchResult | Exception]:
        self.last_batch_sizes, self.last_forward_ms, self.last_forward_tokens = [], [], []
        self.store.expire()
        results: list = [None] * len(ops)
        for wave in session_waves(ops):
            releases = [i for i in wave if ops[i].release]
            for i in releases:
                self.store.release(ops[i].session_id)
                results[i] = empty_result()
            steps = [i for i in wave if not ops[i].release]
            for start in range(0, len(steps), self.config.max_batch):
                self._run_group(ops, steps[start:start + self.config.max_batch], results)
        return results

    # ---- one group of ops on distinct sessions -----------------------------------
    def _run_group(self, ops: list[BranchOp], indices: list[int], results: list) -> None:
        works = []
        for i in indices:
            try:
                works.append(self._prepare(i, ops[i]))
            except BranchError as exc:
                results[i] = exc
        if not works:
            return
        try:
            self._extend(works)
            drafting = [w for w in works if w.wants_more(self.max_len)]
            while drafting:
                rows = 1 if self.lone else self.config.max_forward_tokens
                for start in range(0, len(drafting), rows):
                    self._draft_step(drafting[start:start + rows])
                drafting = [w for w in drafting if w.wants_more(self.max_len)]
        except Exception as exc:  # noqa: BLE001 - a model failure fails this group only
            err = BranchError(f"{self.name}: forward failed: {type(exc).__name__}: {exc}")
            for w in works:
                results[w.index] = err
            return
        for w in works:
            results[w.index] = op_result(w, self.lone)

    def _prepare(self, index: int, op: BranchOp) -> OpWork:
        """Validate an op, open and truncate its session, reserve room for the whole step."""
        check_op(op, self.name, self.model.info.vocab_size, self.config.max_draft_len, self.max_len)
        n = len(op.input_ids)
        need = min(op.keep_len + n + max(op.draft_len - 1, 0), self.max_len)
        first_scored = n - (op.score_last or n)
        sink = self.config.kv_sink_tokens
        width = op.kv_window if op.kv_window + sink < self.max_len else 0  # a window the model exceeds: none
        if op.keep_len == 0:
            fresh = Session(op.session_id, None, 0.0)  # what a new session's window would skip
            skipped = kv_window.plan(fresh, 0, n, first_scored, width, sink).skip
            self.store.admit(op.session_id, need - skipped)
        session = self.store.open(op.session_id, op.keep_len, op.cache_salt)
        if width and session.length == 0 and not session.windowed:
            kv_window.start(session, sink)
        window = kv_window.plan(session, op.keep_len, n, first_scored, width, sink) if session.windowed \
            else kv_window.NO_PLAN
        if window is not kv_window.NO_PLAN:  # positions go: shared blocks become the session's own
            self.store.unshare(session)
        kv_window.evict(session, window.evict_to)
        reused = self.store.attach_prefix(session, op.input_ids, limit=first_scored) \
            if window is kv_window.NO_PLAN else 0
        self.store.reserve(session, need - window.skip)
        work = OpWork(index, op, session, first_scored=first_scored, fed=reused, reused=reused,
                      skip_at=window.skip_at, skip_len=window.skip)
        self._apply_skip(work)
        return work

    def _apply_skip(self, w: OpWork) -> None:
        """Leave the window's skipped inputs out once the inputs before them are fed."""
        if w.skip_len and w.fed == w.skip_at:
            kv_window.skip(w.session, w.skip_len)
            w.fed += w.skip_len
            w.skip_len = 0

    # ---- forwards ----------------------------------------------------------------
    def _extend(self, works: list[OpWork]) -> None:
        """Feed every op its new tokens in forwards of at most ``max_forward_tokens`` padded
        tokens (a long prompt alone, in chunks; short ops together); score the asked positions.

        Input token j sits at sequence index length + j; its logits choose the token at
        index length + j + 1, which is the position its draw is keyed by.
        """
        pending = list(works)
        while pending:
            group = next_forward(pending, self.config.max_forward_tokens, self.lone)
            self._feed(group)
            for w, _ in group:
                self._apply_skip(w)
            pending = [w for w in pending if w.remaining]
        for w in works:
            w.batch_size = w.batch_size or len(works)
            w.drafted = 1 if w.op.draft_len > 0 else 0

    def _feed(self, group: list[tuple[OpWork, int]]) -> None:
        """One forward over a chunk of each op's input; score the asked positions in it."""
        works = [w for w, _ in group]
        chunks, scored = [], []
        for w, size in group:
            start = w.fed
            chunks.append(np.asarray(w.op.input_ids[start:start + size], dtype=np.int64))
            first = max(w.first_scored, start)
            scored.append(np.arange(first - start, size))  # may be empty: nothing asked in this chunk
        starts = [w.session.length for w in works]
        logits = self._forward(works, chunks, scored)
        for row, (w, size) in enumerate(group):
            rel = scored[row]
            if len(rel):
                ids = np.asarray(w.op.input_ids, dtype=np.int64)
                where = w.fed + rel  # input indices scored here
                weights, scale = score_rows(w, logits[row, : len(rel)], starts[row] + rel + 1)
                inner = where < len(ids) - 1  # the last input has no next input to score
                w.input_probs.append((weights[np.nonzero(inner)[0], ids[where[inner] + 1]]
                                      * scale[inner]).astype(np.float32))
                if w.op.logprobs >= 0:
                    inner_rows = np.nonzero(inner)[0]
                    w.input_logprobs.append((logits[row, inner_rows, ids[where[inner] + 1]]
                                             - w.last_norm[inner_rows]).astype(np.float32))
            w.fed += size
            w.batch_size = w.batch_size or len(group)

    def _draft_step(self, works: list[OpWork]) -> None:
        """Feed each drafting op its last drafted token; score the next one."""
        ids = [np.array([w.tokens[-1][-1]], dtype=np.int64) for w in works]
        # the fed token sits at index session.length; the one scored next at length + 1
        positions = [w.session.length + 1 for w in works]
        logits = self._forward(works, ids, [np.zeros(1, dtype=np.int64)] * len(works))
        for row, w in enumerate(works):
            score_rows(w, logits[row, :1], np.array([positions[row]]))
            w.drafted += 1

    def _forward(self, works: list[OpWork], ids: list[np.ndarray], scored: list[np.ndarray]) -> np.ndarray:
        """One model forward over the works' sessions (appends their new KV).

        ``scored[b]``: indices into row b's new tokens that need logits (may be empty).
        Returns logits [B, K, V]: row b's first len(scored[b]) entries are those positions.
        """
        sessions = [w.session for w in works]
        batch = len(sessions)
        lens = np.array([s.entries for s in sessions])  # KV entries (a kv_window drops some positions)
        seq = np.array([s.length for s in sessions])  # sequence positions
        news = np.array([len(x) for x in ids])
        past_len, new_len = int(lens.max()), int(news.max())
        input_ids = np.zeros((batch, new_len), dtype=np.int64)  # right-padded
        mask = np.zeros((batch, past_len + new_len), dtype=np.int64)
        keep = max(1, max(len(x) for x in scored))
        logits_positions = np.zeros((batch, keep), dtype=np.int64)
        for b in range(batch):
            input_ids[b, : news[b]] = ids[b]
            mask[b, past_len - lens[b]: past_len + news[b]] = 1  # left-padded past, then new
            rows = scored[b] if len(scored[b]) else np.array([news[b] - 1])
            logits_positions[b] = np.concatenate([rows, np.full(keep - len(rows), rows[-1])])
        # padded new positions continue the row's count, clipped to the model's range
        position_ids = np.minimum(seq[:, None] + np.arange(new_len)[None, :], self.max_len - 1)
        past = self.store.gather(sessions) if past_len else self.model.empty_past(batch)
        with self.turns.turn() if self.turns is not None else nullcontext():
            t0 = time.perf_counter()  # after the turn: forward_ms is the forward's own cost
            if self.lone and batch == 1 and new_len == 1:
                logits, new_kv = self.model.forward(input_ids, mask, position_ids, past, logits_positions,
                                                    pad=False)
            else:
                logits, new_kv = self.model.forward(input_ids, mask, position_ids, past, logits_positions)
            ms = (time.perf_counter() - t0) * 1e3
        tokens = batch * new_len
        self.last_batch_sizes.append(batch)
        self.last_forward_ms.append(ms)
        self.last_forward_tokens.append(tokens)
        self.largest_forward_tokens = max(self.largest_forward_tokens, tokens)
        for b, w in enumerate(works):
            self.store.append(w.session, new_kv, b, int(news[b]), ids[b])
            w.forward_ms += ms
            w.forward_tokens += tokens
            w.forwards += 1
        return logits
