"""The light branch's quantization (``--light-quant``): each candidate mode quantized and
validated against transformers, timed with ``auto``; the mode kept, and why.

``auto`` times a decode step of each candidate (batch 1 and 8, past ``BENCH_PAST``) and keeps
the fastest at equal top-1 agreement (``quantize.pick_fastest``); a named mode is quantized
and validated only. The sentence on why (``quant_reason``) goes into export.json.
"""
from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path

from tokenrouter_backend.engine.onnx_lm import INFO_FILE, ModelInfo, OnnxCausalLM
from tokenrouter_backend.engine.step_timing import step_ms

from . import progress, quantize
from .branch_stamp import BranchBuild
from .onnx_export import onnx_bytes
from .options import ExportOptions
from .validate import ValidationError, validate_onnx

BENCH_PAST = 128  # past length of the decode-step timings of --light-quant auto
BENCH_WARMUP, BENCH_REPEATS = 2, 10  # untimed, timed steps per timing (median)


def measure_candidate(model_dir: Path, mode: str, refs, prompts, options: ExportOptions, timed: bool) -> dict:
    """Top-1 agreement of one quantized model; with ``timed`` also its decode-step ms
    (batch 1 and 8, past BENCH_PAST), which only ``--light-quant auto`` asks for."""
    precision = ModelInfo.load(model_dir / INFO_FILE).precision
    report = validate_onnx(model_dir, refs, prompts, precision, options.device, check=False).to_dict()
    cand = {"top1_agreement": report["top1_agreement"], "validation": report,
            "batch_invariant": quantize.BATCH_INVARIANT[mode],
            "onnx_bytes": onnx_bytes(model_dir)}
    if timed:
        lm = OnnxCausalLM(model_dir, device=options.device, intra_op_threads=options.threads)
        for batch in (1, 8):
            ms = step_ms(lm, batch, BENCH_PAST, warmup=BENCH_WARMUP, repeats=BENCH_REPEATS)
            cand[f"step_ms_b{batch}"] = round(ms, 2)
    return cand


def quantize_and_pick(fp32_dir: Path, out_dir: Path, refs, prompts, options: ExportOptions,
                      build: BranchBuild) -> None:
    """Quantize the FP32 light model in ``fp32_dir`` per ``options.light_quant`` into
    ``out_dir``, recording every candidate, the pick and its reason on ``build``; a pick that
    fails validation raises ``ValidationError`` (unless validation is skipped)."""
    auto = options.light_quant == quantize.AUTO
    modes = quantize.AUTO_MODES if auto else (options.light_quant,)
    t0 = time.perf_counter()
    for mode in modes:
        cand = fp32_dir.parent / f"light-{mode}"
        with progress.stage("light", f"quantize {mode}, validate" + (" and time it" if auto else "")):
            quantize.quantize_light(fp32_dir, cand, mode)
            build.quant_candidates[mode] = measure_candidate(cand, mode, refs, prompts, options, timed=auto)
        gc.collect()
    build.quantize_s = round(time.perf_counter() - t0, 2)
    chosen = quantize.pick_fastest(build.quant_candidates) if auto else modes[0]
    build.quant_reason = quant_reason(options.light_quant, chosen, build.quant_candidates)
    build.precision = quantize.PRECISION_NAMES[chosen]
    build.validation = build.quant_candidates[chosen]["validation"]
    if out_dir.exists():
        shutil.rmtree(out_dir)
    (fp32_dir.parent / f"light-{chosen}").rename(out_dir)
    for mode in modes:
        shutil.rmtree(fp32_dir.parent / f"light-{mode}", ignore_errors=True)
    if not options.skip_validation and not build.validation.get("passed"):
        raise ValidationError(f"light {chosen}: {build.validation}")


def quant_reason(requested: str, chosen: str, candidates: dict) -> str:
    """The sentence export.json keeps on why the light branch has its quantization."""
    if requested == quantize.AUTO:
        return quantize.auto_reason(candidates, chosen)
    if requested == quantize.DEFAULT_MODE:
        return quantize.DEFAULT_REASON
    variant = "" if quantize.BATCH_INVARIANT[chosen] else " (batch-dependent: activation scale per batch tensor)"
    return f"requested with --light-quant {requested}{variant}"
