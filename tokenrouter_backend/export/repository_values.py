"""What an export writes besides the branches: the templates' ``${name}`` values and the
report (export.json).

The values fill every config.pbtxt (``repository.fill_repository``): devices, runtimes,
threads, context length, end and stop ids, precisions, both branches' KV budgets and the
router's ``max_live_tokens`` (the live tokens both budgets hold), the learned router's file
and bar. The report records the exporter and dependency versions, the options, both
branches' ``BranchBuild`` and the light quantization's reason.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tokenrouter_backend.engine.onnx_lm import INFO_FILE, ModelInfo

from . import router_build, versions
from .branch_stamp import EXPORTER_VERSION, BranchBuild
from .options import ExportOptions

ROUTER_FILE = router_build.ROUTER_FILE  # router_file of an export with a router (read from router/1/)
KV_BUDGET_MB = {"heavy": 2048, "light": 1024}  # kv_cache_budget_mb written into the branch configs
KV_GROWTH_SLACK = 1.25  # a session's buffer may be up to this much larger than its tokens (kv_session)


def placeholder_values(heavy: BranchBuild, light: BranchBuild, tokenizer, work: Path,
                       options: ExportOptions, stop_ids: list[int] = ()) -> dict:
    """The ``${name}`` values of the repository templates."""
    h_info = ModelInfo.load(work / "heavy" / INFO_FILE)
    l_info = ModelInfo.load(work / "light" / INFO_FILE)
    max_ctx = options.max_context or min(h_info.max_position_embeddings, l_info.max_position_embeddings)
    return {
        **kv_budget_values(h_info, l_info),
        "heavy_device": options.device, "light_device": options.device,
        "heavy_runtime": options.runtime, "light_runtime": options.runtime,
        "heavy_threads": options.threads, "light_threads": options.threads,
        "max_context": max_ctx, "end_id": tokenizer.eos_token_id, "vocab_size": h_info.vocab_size,
        "stop_token_ids": ",".join(str(i) for i in stop_ids),
        "heavy_precision": heavy.precision, "light_precision": light.precision,
        "router_file": ROUTER_FILE if options.router or options.train_router else "",
        "router_threshold": "" if options.router_threshold is None else repr(float(options.router_threshold)),
    }


def kv_budget_values(h_info: ModelInfo, l_info: ModelInfo) -> dict:
    """Both branches' KV budgets and the router's max_live_tokens: the live tokens both can hold."""
    fits = min(KV_BUDGET_MB[role] * (1 << 20) / (info.kv_bytes_per_token() * KV_GROWTH_SLACK)
               for role, info in (("heavy", h_info), ("light", l_info)))
    return {"heavy_kv_budget_mb": KV_BUDGET_MB["heavy"], "light_kv_budget_mb": KV_BUDGET_MB["light"],
            "max_live_tokens": int(fits)}


def export_report(options: ExportOptions, heavy: BranchBuild, light: BranchBuild, values: dict,
                  total_s: float) -> dict:
    """export.json's report: what was exported, from what, with which options and values."""
    return {"exporter_version": EXPORTER_VERSION, "dependencies": versions.dependency_versions(),
            "options": {k: str(v) for k, v in asdict(options).items()},
            "light_quantization": {"mode": light.precision, "reason": light.quant_reason},
            "placeholders": values, "heavy": asdict(heavy), "light": asdict(light),
            "total_s": total_s}
