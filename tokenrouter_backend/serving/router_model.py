"""Triton glue of the ``router`` model (Python backend, decoupled, async BLS).

``execute`` starts one coroutine per request and returns; each coroutine reads its
request once (``router_inputs.RouterInputs``), runs the block loop against the heavy/light
branches (BLS through ``backend.bls_exec``, or gRPC to a heavy server) and streams final
token ids (plus routing stats) to postprocessing (the final response says how many
characters of its text a stop string began in: ``STOP_TRIM``). The router decodes with
the tokenizer the exporter copied into ``router/1/tokenizer`` to match stop strings on
text. Every request ends with exactly one COMPLETE_FINAL response: the last tokens or an
error whose message starts with its category (``core/protocol/failures.py``: invalid, busy,
branch failure, cancelled, stopping, internal) and which never holds a branch's address.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
import traceback
from pathlib import Path

import numpy as np

from tokenrouter_backend.branches.bls import BlsBranch
from tokenrouter_backend.branches.deadline import DEADLINE_SLACK_S, DeadlineBranch
from tokenrouter_backend.branches.heavy_pool import HeavyPool, PoolConfig, parse_heavy_urls
from tokenrouter_backend.branches.remote import RemoteBranch, resolve_heavy_url
from tokenrouter_backend.core.loop.answer_cache import AnswerCache
from tokenrouter_backend.core.loop.block_loop import RequestCancelled, generate
from tokenrouter_backend.core.loop.routing_trace import routing_runs
from tokenrouter_backend.core.loop.stats import RequestStats
from tokenrouter_backend.core.protocol.branch_auth import key_parameters, load_key
from tokenrouter_backend.core.protocol.branch_protocol import BranchError, KVBudgetFull
from tokenrouter_backend.core.protocol.failures import Failure, branch_failure
from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults, dataclass_from_config
from tokenrouter_backend.core.signals.cost_model import MeteredBranch
from tokenrouter_backend.core.signals.prompt_segments import TokenSurprise
from tokenrouter_backend.core.signals.prompt_surprise import PromptSurprise
from tokenrouter_backend.core.signals.prompt_surprise import measure as measure_surprise
from tokenrouter_backend.core.text.detokenize import Detokenizer, stream_window
from tokenrouter_backend.operations.admission import Operations, RequestInfo
from tokenrouter_backend.operations.admission_gate import AdmissionGate, GateConfig, ServerBusy
from tokenrouter_backend.operations.route_setup import build_route_gate, vocabulary_texts
from tokenrouter_backend.serving.backend import bls_exec, metric_family
from tokenrouter_backend.serving.logprob_tensors import EMPTY_OUTPUTS, LogprobBuffer
from tokenrouter_backend.serving.request import parse_request, request_info
from tokenrouter_backend.serving.router_inputs import RouterInputs, read_router_request
from tokenrouter_backend.serving.tensors import bound_bytes_inputs, config_parameters, error_response
from tokenrouter_backend.serving.text_models import find_tokenizer

OUTPUT_IDS = "OUTPUT_IDS"
PREFIX_LEN = "PREFIX_LEN"
IS_FINAL = "IS_FINAL"
ROUTING_STATS = "ROUTING_STATS"
STOP_TRIM = "STOP_TRIM"


REASONS = {Failure.INVALID: "invalid", Failure.BUSY: "busy", Failure.CANCELLED: "cancelled"}  # metric labels


def client_failure(exc: BaseException) -> tuple[Failure, str]:
    """What a client is told of a request that failed with ``exc``: its category and message
    (``core/protocol/failures.py``); a branch error's detail, which may hold an address, is not."""
    if isinstance(exc, InvalidRequest):
        return Failure.INVALID, str(exc)
    if isinstance(exc, ServerBusy):
        return Failure.BUSY, str(exc)  # its message starts "server busy:"
    if isinstance(exc, RequestCancelled):
        return Failure.CANCELLED, Failure.CANCELLED.message("by the client")
    if isinstance(exc, KVBudgetFull):  # admission keeps it from happening; if it does, busy
        return Failure.BUSY, branch_failure(str(exc), exc.reason, Failure.BUSY)
    if isinstance(exc, BranchError):
        return Failure.BRANCH, branch_failure(str(exc), exc.reason)
    if isinstance(exc, asyncio.CancelledError):
        return Failure.STOPPING, Failure.STOPPING.message("the router stopped during the request")
    return Failure.INTERNAL, Failure.INTERNAL.message(type(exc).__name__)


class ResponseWriter:
    """Turns emitted final tokens into router responses (streamed windows or one answer)."""

    def __init__(self, pb_utils, sender, stream: bool, routing_decode=None, logprobs: int = -1):
        self.pb, self.sender, self.stream = pb_utils, sender, stream
        self.routing_decode = routing_decode  # set (a decoder) when the request asked for show_routing
        self.tokens: list[int] = []
        self.sent = 0  # tokens already covered by a response
        self.logprobs = LogprobBuffer(logprobs) if logprobs >= 0 else None  # the request asked for them

    def emit(self, tokens, stats: RequestStats, finished: bool) -> None:
        self.tokens.extend(int(t) for t in tokens)
        if not finished and (not self.stream or len(self.tokens) == self.sent):
            return
        window, prefix = stream_window(self.tokens, self.sent) if self.stream else (self.tokens, 0)
        self.sent = len(self.tokens)
        pb = self.pb
        response = pb.InferenceResponse(output_tensors=[
            pb.Tensor(OUTPUT_IDS, np.asarray(window, dtype=np.int32).reshape(1, -1)),
            pb.Tensor(PREFIX_LEN, np.array([[prefix]], dtype=np.int32)),
            pb.Tensor(IS_FINAL, np.array([[finished]], dtype=bool)),
            pb.Tensor(ROUTING_STATS, np.array([[self._stats_json(stats, finished).encode()]], dtype=np.object_)),
            pb.Tensor(STOP_TRIM, np.array([[stats.stop_trim_chars if finished else 0]], dtype=np.int32)),
            *(pb.Tensor(name, array) for name, array in
              (self.logprobs.take() if self.logprobs is not None else EMPTY_OUTPUTS).items()),
        ])
        flags = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if finished else 0
        self.sender.send(response, flags=flags)


    def _stats_json(self, stats: RequestStats, finished: bool) -> str:
        if not (finished and self.routing_decode):
            return stats.to_json()
        d = stats.to_dict()
        d["routing"] = routing_runs(self.tokens, stats.token_kinds, self.routing_decode, stats.stop_trim_chars)
        return json.dumps(d, separators=(",", ":"))


class RouterModel:
    """The router model; ``pb_utils`` injected so tests can drive it with a stub."""

    def __init__(self, pb_utils, args: dict):
        self.pb = pb_utils
        bound_bytes_inputs(pb_utils)  # stop_words & co.: never more than MAX_BYTES_ELEMENTS deserialized
        self.defaults = RouterDefaults.from_config(config_parameters(args))
        self.ops = Operations(config_parameters(args), self.defaults, metric_family(pb_utils),
                              warn=pb_utils.Logger.log_warn)
        self.logger = pb_utils.Logger  # before _heavy_branch(), which logs a remote URL
        self.gate = AdmissionGate(dataclass_from_config(GateConfig, config_parameters(args)))
        self.branch_auth = key_parameters(load_key(Path(args["model_repository"])))
        timeout_ms = int(self.defaults.branch_timeout_s * 1000)
        deadline_s = self.defaults.branch_timeout_s + DEADLINE_SLACK_S  # every branch call, running or queued
        self.exec_bls = bls_exec(pb_utils)
        self.light = MeteredBranch(DeadlineBranch(BlsBranch(LIGHT, self.defaults.light_model, self.exec_bls,
                                                            timeout_ms, parameters=self.branch_auth), deadline_s),
                                   self.ops.costs.light)
        self.pool_config = dataclass_from_config(PoolConfig, config_parameters(args), prefix="heavy_pool_")
        self.heavy_branch = self._heavy_branch(timeout_ms)
        self.heavy = MeteredBranch(DeadlineBranch(self.heavy_branch, deadline_s), self.ops.costs.heavy)
        tokenizer = find_tokenizer(args, config_parameters(args))
        self.decode = None if tokenizer is None else Detokenizer(tokenizer).decode
        self.vocab_texts = [] if tokenizer is None else vocabulary_texts(tokenizer)
        self.route_gate = build_route_gate(config_parameters(args), None if tokenizer is None
                                           else self.vocab_texts, self._version_dir(args))
        self.plain_gate = dataclasses.replace(self.route_gate, router=None)
        self.inflight: set[asyncio.Task] = set()
        self.answers = AnswerCache(self.defaults.answer_cache_entries)  # the decision cache

    def _gate_for(self, inputs: RouterInputs):
        """The server's route gate; input learned_router=false: the same without the learned router (A/B)."""
        if inputs.learned_router is False and self.route_gate.router is not None:
            return self.plain_gate
        return self.route_gate

    @staticmethod
    def _version_dir(args: dict) -> Path:
        return Path(args["model_repository"]) / str(args.get("model_version", "1"))

    def _heavy_branch(self, timeout_ms: int):
        """BLS to the heavy model here, or gRPC to a separate heavy server (heavy_url)."""
        urls = parse_heavy_urls(resolve_heavy_url(self.defaults.heavy_url))
        if not urls:
            return BlsBranch(HEAVY, self.defaults.heavy_model, self.exec_bls, timeout_ms, parameters=self.branch_auth)
        self.logger.log_info(f"router: heavy branch is remote at {', '.join(urls)}")
        if len(urls) == 1:
            return RemoteBranch(HEAVY, urls[0], model=self.defaults.heavy_model,
                                timeout_s=self.defaults.branch_timeout_s, parameters=self.branch_auth)
        return HeavyPool(HEAVY, urls, model=self.defaults.heavy_model, timeout_s=self.defaults.branch_timeout_s,
                         parameters=self.branch_auth, config=self.pool_config)

    def _report_pool(self) -> None:
        """Per-server heavy pool metrics (counts since the last report, sessions and health now)."""
        pool = self.heavy_branch
        if isinstance(pool, HeavyPool) and self.ops.metrics is not None:
            from tokenrouter_backend.operations.metrics import pool_updates  # noqa: PLC0415 - only with metrics

            c = pool.take_counters()
            self.ops.metrics.submit(pool_updates(c.calls, c.opened, c.failovers, pool.sessions(), pool.up()))

    async def execute(self, requests) -> None:
        loop = asyncio.get_running_loop()
        for request in requests:
            task = loop.create_task(self.serve(request))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
        return None

    async def serve(self, request) -> None:
        pb = self.pb
        sender = request.get_response_sender()
        mode, arm, reason = self.defaults.mode, "", "error"  # labels if it fails before admission
        held = 0  # KV tokens this request holds in the admission gate
        try:
            inputs = read_router_request(pb, request, self.defaults.max_input_tokens)  # its only read, sizes first
            gen_request = parse_request(inputs, self.defaults, decode=self.decode,
                                        vocab=len(self.vocab_texts) or None)
            info = request_info(inputs)
            tokens = len(gen_request.prompt) + gen_request.params.max_tokens  # admission never changes these
            # before any branch work (the perplexity below is light work); a client that cancels leaves the queue
            queued = time.perf_counter()
            await self.gate.enter(tokens, sender.is_cancelled)
            held = tokens
            queued_ms = (time.perf_counter() - queued) * 1e3
            info, surprise = await self._request_level(info, gen_request.cache_salt)
            admission = self.ops.admit(info, gen_request.params)
            mode, arm = admission.params.mode, admission.arm
            gen_request = dataclasses.replace(gen_request, params=admission.params, route_gate=self._gate_for(inputs),
                                              prompt_surprise=surprise, queued_ms=queued_ms)
            show = bool(inputs.show_routing) and self.decode is not None
            writer = ResponseWriter(pb, sender, gen_request.params.stream, self.decode if show else None,
                                    gen_request.logprobs)
            stats = await generate(gen_request, self.light, self.heavy, writer.emit, is_cancelled=sender.is_cancelled,
                                   hooks=admission.hooks, request_id=admission.request_id, answers=self.answers,
                                   on_logprobs=writer.logprobs.add if writer.logprobs is not None else None,
                                   on_prompt_logprobs=writer.logprobs.add_prompt if writer.logprobs is not None
                                   else None)
            self.ops.finish(admission, stats)
            return
        except asyncio.CancelledError:  # the task itself cancelled: still one final response
            self._fail(sender, *client_failure(asyncio.CancelledError()))
            raise
        except Exception as exc:  # noqa: BLE001 - one request fails, the server keeps serving
            failure, message = client_failure(exc)
            reason = REASONS.get(failure, "error")
            if failure is Failure.INTERNAL:
                self.logger.log_error("router: internal error\n" + traceback.format_exc())
            elif isinstance(exc, BranchError):  # the detail (a remote branch's address) for the log only
                self.logger.log_error(f"router: request failed in a branch: {exc}")
            self._fail(sender, failure, message)
        finally:
            if held:
                self.gate.leave(held)
            self._report_pool()
        self.ops.fail(mode, arm or "none", reason)

    async def _request_level(self, info: RequestInfo, salt: str) -> tuple[RequestInfo, PromptSurprise | None]:
        """What request-level routing reads: the prompt's text, and for the requests it decides
        with perplexity, the light model's NLL per prompt token (mapped onto the text)."""
        if not (self.ops.request_policy.policy and self.decode is not None):
            return info, None
        info = dataclasses.replace(info, prompt_text=self.decode(info.prompt))
        surprise = await self._prompt_surprise(info.prompt, salt) if self.ops.wants_surprise(info) else None
        if surprise is None:
            return info, None
        texts = [self.vocab_texts[t] if 0 <= t < len(self.vocab_texts) else "" for t in info.prompt]
        return dataclasses.replace(info, surprise=TokenSurprise.on_text(surprise, texts)), surprise

    async def _prompt_surprise(self, prompt, salt: str) -> PromptSurprise | None:
        """The light model's NLL on the prompt's first tokens (request-level routing); None when
        the light branch cannot score it now (the policy then decides on the rules alone)."""
        policy = self.ops.request_policy
        try:
            return await measure_surprise(self.light, prompt, random.getrandbits(63), policy.perplexity_tokens,
                                          policy.perplexity_chunk, cache_salt=salt)
        except BranchError as exc:
            self.logger.log_warn(f"router: light perplexity for request-level routing unavailable: {exc}")
            return None

    def _fail(self, sender, failure: Failure, message: str) -> None:
        """The request's one final response: ``message`` (``failure``'s prefix first, see
        core/protocol/failures.py) with ``failure``'s Triton error code."""
        try:
            sender.send(error_response(self.pb, message, failure.triton_code),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - the client is gone; nothing left to tell it
            pass

    async def drain(self, timeout_s: float) -> None:
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=timeout_s)
        self.ops.close()
