"""One branch built into the work directory: heavy, light, or (``--runtime torch``) either as
an HF folder.

Heavy: FP32 ONNX on CPU (FP16 with ``--device cuda``), validated against transformers.
Light: FP32 ONNX, then quantized per ``--light-quant`` (``light_pick``). Torch runtime: the
weights as an HF folder (``hf/``) and a model.json, validated by a prefill. A branch whose
stamp matches (``branch_stamp``) is reused without loading its model.
"""
from __future__ import annotations

import gc
import shutil
import sys
import time
from pathlib import Path

from tokenrouter_backend.engine.onnx_lm import INFO_FILE

from . import progress
from .branch_stamp import HF_DIR, BranchBuild, reused_build, save_stamp, stamp_key
from .light_pick import quantize_and_pick
from .onnx_export import export_model, model_info, onnx_bytes, onnx_files, write_info
from .options import ExportOptions
from .sources import Source, load_model
from .validate import prompt_ids, reference_logits, validate_onnx

CPU_FP32_NOTE = ("heavy is FP32 on CPU: ONNX Runtime has no fast FP16 CPU kernels; "
                 "FP16 is used with --device cuda")


def fresh_dir(path: Path) -> Path:
    """``path`` as a new empty directory (whatever was there removed)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _export_fp(source, tokenizer, out_dir: Path, half: bool, build: BranchBuild):
    """Load, compute reference logits, export; returns (prompts, refs)."""
    t0 = time.perf_counter()
    with progress.stage(build.role, f"load {Path(source.path).name}"):
        model = load_model(source)
        build.load_s = round(time.perf_counter() - t0, 2)
        prompts = list(prompt_ids(tokenizer))
        refs = reference_logits(model, prompts)
    info = model_info(model, precision="fp16" if half else "fp32",
                      kv_dtype="float16" if half else "float32", source=str(source.path))
    t0 = time.perf_counter()
    with progress.stage(build.role, f"export ONNX ({'fp16' if half else 'fp32'})"):
        export_model(model, fresh_dir(out_dir), half=half)
    build.export_s = round(time.perf_counter() - t0, 2)
    write_info(info, out_dir)
    del model
    gc.collect()
    return prompts, refs


def save_hf(model, out_dir: Path) -> None:
    """config.json + safetensors; GGUF-loaded models refuse save_pretrained: state_dict instead."""
    try:
        model.save_pretrained(out_dir)
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError for GGUF-loaded models
        from safetensors.torch import save_file

        print(f"save_pretrained refused ({exc}); writing the state_dict", file=sys.stderr)
        model.config.save_pretrained(out_dir)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def export_torch_branch(source: Source, tokenizer, work: Path, role: str, options: ExportOptions) -> BranchBuild:
    """Torch runtime: the weights as an HF folder + model.json, validated by a prefill."""
    import torch

    from .validate import validate_torch

    out_dir = work / role
    key = stamp_key(source, role, options)
    reused = reused_build(out_dir, key)
    if reused:
        return reused
    half = options.device == "cuda"
    dtype = "float16" if half else "float32"
    build = BranchBuild(role, str(out_dir), str(source.path), "fp16" if half else "fp32")
    no_int8 = "; no INT8 on torch" if role == "light" else ""
    build.notes.append(f"torch runtime: {dtype} on {options.device}{no_int8}")
    t0 = time.perf_counter()
    with progress.stage(role, f"load {Path(source.path).name}"):
        model = load_model(source)
        build.load_s = round(time.perf_counter() - t0, 2)
        prompts = list(prompt_ids(tokenizer))
        refs = reference_logits(model, prompts)
    info = model_info(model, precision=build.precision, kv_dtype=dtype, source=str(source.path))
    t0 = time.perf_counter()
    fresh_dir(out_dir)
    with progress.stage(role, f"save HF folder ({dtype})"):
        save_hf(model.to(torch.float16) if half else model, out_dir / HF_DIR)
    write_info(info, out_dir)
    build.export_s = round(time.perf_counter() - t0, 2)
    del model
    gc.collect()
    if not options.skip_validation:
        with progress.stage(role, f"validate on {options.device}"):
            build.validation = validate_torch(out_dir, refs, prompts, build.precision, options.device).to_dict()
    build.onnx_bytes = sum(f.stat().st_size for f in (out_dir / HF_DIR).iterdir())
    save_stamp(out_dir, key, build)
    return build


def export_heavy(source: Source, tokenizer, work: Path, options: ExportOptions) -> BranchBuild:
    """Heavy branch: FP32 (cpu) or FP16 (cuda), validated."""
    if options.runtime == "torch":
        return export_torch_branch(source, tokenizer, work, "heavy", options)
    out_dir = work / "heavy"
    key = stamp_key(source, "heavy", options)
    reused = reused_build(out_dir, key)
    if reused:
        return reused
    half = options.device == "cuda"
    build = BranchBuild("heavy", str(out_dir), str(source.path), "fp16" if half else "fp32")
    if not half:
        build.notes.append(CPU_FP32_NOTE)
    prompts, refs = _export_fp(source, tokenizer, out_dir, half, build)
    if not options.skip_validation:
        with progress.stage("heavy", "validate against transformers"):
            build.validation = validate_onnx(out_dir, refs, prompts, build.precision, options.device).to_dict()
    build.onnx_bytes = onnx_bytes(out_dir)
    save_stamp(out_dir, key, build)
    return build


def export_light(source: Source, tokenizer, work: Path, options: ExportOptions) -> BranchBuild:
    """Light branch: FP32 export, then INT8 per ``options.light_quant`` (auto: timed pick)."""
    if options.runtime == "torch":
        return export_torch_branch(source, tokenizer, work, "light", options)
    out_dir = work / "light"
    key = stamp_key(source, "light", options)
    reused = reused_build(out_dir, key)
    if reused:
        return reused
    fp32_dir = work / "light-fp32"
    build = BranchBuild("light", str(out_dir), str(source.path), "fp32")
    prompts, refs = _export_fp(source, tokenizer, fp32_dir, False, build)
    if options.light_quant == "none":
        fresh_dir(out_dir)
        for f in onnx_files(fp32_dir) + [fp32_dir / INFO_FILE]:
            shutil.move(str(f), out_dir / f.name)
        if not options.skip_validation:
            with progress.stage("light", "validate against transformers"):
                build.validation = validate_onnx(out_dir, refs, prompts, "fp32", options.device).to_dict()
        build.quant_reason = "requested with --light-quant none: the light branch stays FP32"
    else:
        quantize_and_pick(fp32_dir, out_dir, refs, prompts, options, build)
    shutil.rmtree(fp32_dir, ignore_errors=True)
    build.onnx_bytes = onnx_bytes(out_dir)
    save_stamp(out_dir, key, build)
    return build
