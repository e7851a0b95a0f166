"""Triton glue of the branch models ``heavy`` and ``light`` (Python backend, non-decoupled).

``model_repository/{heavy,light}/1/model.py`` is one line importing ``TritonPythonModel``.
``initialize`` parses config.pbtxt ``parameters`` once (``BranchParams.from_config``) and
loads the model (``runtime`` onnx: ``OnnxCausalLM``; torch: ``TorchCausalLM``, KV kept on
its device); ``execute`` turns every request Triton batched into a ``BranchOp``, runs the
engine ONCE for all of them and answers each request with its result or its own error.
Sessions live in this instance: keep ``instance_group { count: 1 }``.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import triton_python_backend_utils as pb_utils

from tokenrouter_backend.core.protocol.branch_auth import BranchGuard, load_key
from tokenrouter_backend.core.protocol.branch_protocol import encode_error, op_from_arrays, result_to_arrays
from tokenrouter_backend.core.protocol.params import ConfigCheck, config_error, dataclass_from_config
from tokenrouter_backend.engine.branch_engine import BranchEngine, EngineConfig
from tokenrouter_backend.engine.core_turns import CoreTurns
from tokenrouter_backend.engine.onnx_lm import OrtThreading
from tokenrouter_backend.operations.metrics import COUNTER, GAUGE, HISTOGRAM, SumCount
from tokenrouter_backend.serving.backend import metric_family
from tokenrouter_backend.serving.tensors import config_outputs, config_parameters

DEVICES = ("cpu", "cuda", "tensorrt")
RUNTIMES = ("onnx", "torch")  # onnx (default): ONNX Runtime; torch: transformers on torch
TORCH_DEVICES = ("cpu", "cuda")
DTYPES = ("auto", "float16", "float32", "bfloat16")  # torch runtime; auto: FP16 on cuda, FP32 on cpu
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32]
FORWARD_MS_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]


@dataclass(frozen=True)
class BranchParams:
    """config.pbtxt parameters of a branch model (defaults apply to absent or empty keys).

    Read by ``core.params.dataclass_from_config``, the router's parser: the engine's knobs
    (``EngineConfig``) are parameters of their own, every key must name a field, and
    ``CHECKS`` bounds the numbers and names the allowed values (``device``: by ``runtime``).
    """

    onnx_dir: str = "."  # relative to the version directory: where model.onnx/model.json live
    device: str = "cpu"  # cpu | cuda | tensorrt (ONNX Runtime execution provider; torch: cpu | cuda)
    intra_op_threads: int = 0  # ONNX Runtime threads; 0 = its default (all cores)
    intra_op_spinning: bool = True  # idle ONNX Runtime threads busy-wait between parallel sections
    share_cores: bool = False  # forwards take turns on the CPU with the other branch (core_turns)
    core_wait_ms: float = 1000.0  # longest wait for a turn; then the forward runs anyway
    core_slice_ms: float = 500.0  # a turn is kept across one execute()'s forwards this long
    runtime: str = "onnx"  # onnx | torch
    hf_dir: str = "hf"  # torch runtime: HF folder (config.json + safetensors), relative to the version dir
    dtype: str = "auto"  # torch runtime: auto | float16 | float32 | bfloat16
    engine: EngineConfig = field(default_factory=EngineConfig)

    @classmethod
    def from_config(cls, parameters: Mapping[str, str], model: str) -> "BranchParams":
        """Parse config.pbtxt parameters; raises InvalidRequest naming the model, the parameter
        and what it allows."""
        params = dataclass_from_config(cls, parameters, checks=CHECKS, model=model, strict=True)
        devices = TORCH_DEVICES if params.runtime == "torch" else DEVICES
        if params.device not in devices:
            raise config_error("device", "one of " + ", ".join(devices), params.device, model)
        return params


CHECKS = {  # device: by runtime, in from_config
    "runtime": ConfigCheck(choices=RUNTIMES),
    "dtype": ConfigCheck(choices=DTYPES),
    "intra_op_threads": ConfigCheck(low=0),
    "core_wait_ms": ConfigCheck(low=0.0),
    "core_slice_ms": ConfigCheck(low=0.0),
    "max_draft_len": ConfigCheck(low=0),
    "session_ttl_s": ConfigCheck(low=1e-3),
    "kv_cache_budget_mb": ConfigCheck(low=1e-3),
    "max_batch": ConfigCheck(low=1),
    "max_forward_tokens": ConfigCheck(low=1),
    "prefix_cache_block_tokens": ConfigCheck(low=1),
    "kv_sink_tokens": ConfigCheck(low=0),
}


def load_model(params: BranchParams, version_dir: Path):
    """The branch's causal LM for its runtime; returns (model, the directory it came from)."""
    if params.runtime == "torch":
        from tokenrouter_backend.engine.torch_lm import TorchCausalLM  # torch is heavy: import when a model loads

        model_dir = (version_dir / params.hf_dir).resolve()
        return TorchCausalLM(model_dir, device=params.device, dtype=params.dtype), model_dir
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM  # onnxruntime is heavy: import when a model loads

    model_dir = (version_dir / params.onnx_dir).resolve()
    # taking turns: threads stop spinning when a forward ends, so the next turn finds the cores free
    threading = OrtThreading(spinning=params.intra_op_spinning, spin_between_runs=not params.share_cores)
    return OnnxCausalLM(model_dir, device=params.device, intra_op_threads=params.intra_op_threads,
                        threading=threading), model_dir


def _family(name: str, description: str, kind: str):
    """A MetricFamily kept alive in _FAMILIES: pb_utils refuses Metrics whose family was freed;
    None for a kind the backend lacks."""
    family = _new_family(name, description, kind)
    if family is not None:
        _FAMILIES.append(family)
    return family


_FAMILIES: list = []
_new_family = metric_family(pb_utils)


class BranchMetrics:
    """Prometheus families of one branch (labels {branch}); fed after every execute()."""

    def __init__(self, branch: str):
        labels = {"branch": branch}
        self.sessions = _family("tokenrouter_kv_sessions", "Live KV-cache sessions of a branch model",
                                GAUGE).Metric(labels)
        self.kv_bytes = _family("tokenrouter_kv_bytes", "Bytes held by a branch model's live KV-cache sessions "
                                "(private tails and the prefix blocks they share)", GAUGE).Metric(labels)
        self.cache = PrefixCacheMetrics(labels)
        self.kv_peak = _family("tokenrouter_kv_peak_bytes", "Most bytes a branch model's KV cache held at once",
                               GAUGE).Metric(labels)
        self.forward_tokens_max = _family("tokenrouter_branch_forward_tokens_max",
                                          "Most padded tokens one forward of a branch model carried",
                                          GAUGE).Metric(labels)
        dropped = _family("tokenrouter_kv_dropped_sessions_total",
                          "Sessions dropped without release (ttl) or refused at creation (budget)", COUNTER)
        self.dropped = {r: dropped.Metric({**labels, "reason": r}) for r in ("ttl", "budget")}
        self._seen = {"ttl": 0, "budget": 0}
        self.batch = _histogram("tokenrouter_branch_batch_size", "Sessions per batched forward",
                                BATCH_BUCKETS, labels)
        self.forward_ms = _histogram("tokenrouter_branch_forward_ms", "Milliseconds per model forward",
                                     FORWARD_MS_BUCKETS, labels)
        self.turns = turn_metrics(labels)

    def record(self, engine: BranchEngine) -> None:
        store = engine.store
        self.sessions.set(store.session_count)
        self.kv_bytes.set(store.session_bytes)
        if store.prefix_cache is not None:
            self.cache.record(store.prefix_cache)
        self.kv_peak.set(store.peak_bytes)
        self.forward_tokens_max.set(engine.largest_forward_tokens)
        for reason, total in (("ttl", store.expired), ("budget", store.refused)):
            if total > self._seen[reason]:
                self.dropped[reason].increment(total - self._seen[reason])
                self._seen[reason] = total
        for size, ms in zip(engine.last_batch_sizes, engine.last_forward_ms):
            self.batch.observe(size)
            self.forward_ms.observe(ms)
        if engine.turns is not None:
            self.turns.record(engine.turns.stats)


def turn_metrics(labels: dict) -> TotalsAsCounters:
    """Counters of a branch's turns on the CPU cores (labels {branch}; ``share_cores``)."""
    return TotalsAsCounters({
        "turns": _family("tokenrouter_branch_core_turns_total",
                         "Forwards of a branch that ran holding the turn on the CPU cores", COUNTER).Metric(labels),
        "overlaps": _family("tokenrouter_branch_core_overlaps_total",
                            "Forwards of a branch that ran beside the other branch's after core_wait_ms",
                            COUNTER).Metric(labels),
        "waited_ms": _family("tokenrouter_branch_core_wait_ms_total",
                             "Milliseconds a branch's forwards waited for their turn on the CPU cores",
                             COUNTER).Metric(labels),
    })


class PrefixCacheMetrics:
    """Prometheus families of one branch's prefix cache (labels {branch})."""

    def __init__(self, labels: dict):
        self.blocks = _family("tokenrouter_prefix_cache_blocks", "KV blocks in a branch's prefix cache "
                              "(shared by live sessions or idle)", GAUGE).Metric(labels)
        self.bytes = _family("tokenrouter_prefix_cache_bytes", "Bytes of a branch's prefix-cache blocks",
                             GAUGE).Metric(labels)
        self.counters = TotalsAsCounters({
            "lookup_tokens": _family("tokenrouter_prefix_cache_lookup_tokens_total",
                                     "Input tokens of steps that looked for a cached prefix", COUNTER).Metric(labels),
            "hit_tokens": _family("tokenrouter_prefix_cache_hit_tokens_total",
                                  "Input tokens whose KV the prefix cache supplied", COUNTER).Metric(labels),
            "evicted_blocks": _family("tokenrouter_prefix_cache_evicted_blocks_total",
                                      "Idle prefix-cache blocks evicted for room", COUNTER).Metric(labels),
        })

    def record(self, cache) -> None:
        self.blocks.set(cache.block_count)
        self.bytes.set(cache.bytes)
        self.counters.record(cache.stats)


class TotalsAsCounters:
    """Prometheus counters fed from running totals (attributes of a stats object, by name):
    each ``record`` adds what each total grew by since the last one."""

    def __init__(self, counters: dict):
        self.counters = counters
        self._seen = dict.fromkeys(counters, 0)

    def record(self, totals) -> None:
        for name, metric in self.counters.items():
            total = getattr(totals, name)
            if total > self._seen[name]:
                metric.increment(total - self._seen[name])
                self._seen[name] = total


def _histogram(name: str, description: str, buckets: list, labels: dict):
    family = _family(name, description, HISTOGRAM)
    if family is None:  # stubs without HISTOGRAM: counters <name>_sum / <name>_count
        return SumCount(_family(f"{name}_sum", description + " (sum)", COUNTER).Metric(labels),
                        _family(f"{name}_count", description + " (count)", COUNTER).Metric(labels))
    return family.Metric(labels, buckets=buckets)


class TritonPythonModel:
    """A branch model: one BranchEngine (ONNX model + KV sessions) per instance."""

    def initialize(self, args: dict) -> None:
        self.name = args["model_name"]
        self.params = BranchParams.from_config(config_parameters(args), self.name)
        # a repository exported before an output existed does not declare it: leave it out
        # (the router takes such outputs as optional, branch_protocol.result_from_arrays)
        self.outputs = config_outputs(args)
        self.guard = BranchGuard(self.name, load_key(Path(args["model_repository"])))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        model, model_dir = load_model(self.params, version_dir)
        # both branches of a server lock the repository directory that holds them
        turns = (CoreTurns(Path(args["model_repository"]).resolve().parent, self.params.core_wait_ms,
                           self.params.core_slice_ms) if self.params.share_cores else None)
        self.engine = BranchEngine(model, config=self.params.engine, name=self.name, turns=turns)
        try:
            self.metrics = BranchMetrics(self.name)
        except Exception as exc:  # noqa: BLE001 - metrics off (--allow-metrics=false) must not stop serving
            pb_utils.Logger.log_warn(f"{self.name}: metrics disabled: {exc}")
            self.metrics = None
        info = model.info
        pb_utils.Logger.log_info(
            f"{self.name}: loaded {model_dir} ({self.params.runtime}, {info.precision}, "
            f"{info.num_layers} layers, vocab {info.vocab_size}, {info.max_position_embeddings} positions) "
            f"on {self.params.device}; {self.params.engine}")

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        ops, where = [], []
        for i, request in enumerate(requests):
            refusal = self.guard.refusal(_parameters(request))
            if refusal is not None:
                responses[i] = _error(refusal)
                continue
            try:
                ops.append(op_from_arrays(lambda name, r=request: _input(r, name)))
                where.append(i)
            except ValueError as exc:
                responses[i] = _error(f"{self.name}: {exc}")
        try:
            results = self.engine.run(ops)
        except Exception as exc:  # noqa: BLE001 - an engine bug fails this batch, not the server
            pb_utils.Logger.log_error(f"{self.name}: engine failed:\n{traceback.format_exc()}")
            results = [RuntimeError(f"{self.name}: internal error: {type(exc).__name__}: {exc}")] * len(ops)
        for i, result in zip(where, results):
            responses[i] = _error(encode_error(result)) if isinstance(result, Exception) \
                else _response(result, self.outputs)
        self._record_metrics()
        return responses

    def _record_metrics(self) -> None:
        if self.metrics is None:
            return
        try:
            self.metrics.record(self.engine)
        except Exception as exc:  # noqa: BLE001 - observability never fails a request
            pb_utils.Logger.log_warn(f"{self.name}: metrics disabled after error: {exc}")
            self.metrics = None

    def finalize(self) -> None:
        sessions = self.engine.store.session_count
        pb_utils.Logger.log_info(f"{self.name}: unloading with {sessions} live sessions")


def _parameters(request):
    try:
        return request.parameters()  # JSON text of the request's parameters
    except Exception:  # noqa: BLE001 - unreadable parameters carry no key
        return None


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _response(result, outputs: frozenset[str]):
    tensors = [pb_utils.Tensor(name, array) for name, array in result_to_arrays(result).items() if name in outputs]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _error(message: str):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
