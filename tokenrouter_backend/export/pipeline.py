"""``tokenrouter export``: a heavy/light pair (HF folders or GGUF files) -> ONNX branches,
validated, and (with a template) a filled Triton model repository.

Branch ONNX files are built in a work directory (default ``.<OUT name>.build`` beside OUT) with one stamp per
branch (hash of the source's files + the options that shape that branch); a branch whose
stamp matches is reused, so a second run does no work. The demo export keeps its work
directory in the data cache and later repositories hard-link from it.

``--runtime torch`` skips ONNX: each branch directory gets the weights as an HF folder
(``hf/``: config.json + safetensors, FP16 with ``--device cuda``) and a model.json, served by
``tokenrouter_backend.engine.torch_lm`` (light too runs FP16/FP32 there, not INT8).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenrouter_backend.core.learned_router import LearnedRouter
from tokenrouter_backend.engine.onnx_lm import INFO_FILE, ModelInfo, OnnxCausalLM
from tokenrouter_backend.engine.step_timing import step_ms
from tokenrouter_backend.learning import router_prompts

from . import progress, quantize, router_build, versions
from .onnx_export import export_model, model_info, onnx_bytes, onnx_files, write_info
from .repository import EXPORT_REPORT, fill_repository, write_report
from .sources import (
    Source,
    document_end_ids,
    fingerprint,
    load_model,
    load_tokenizer,
    resolve_source,
    tokenizer_differences,
)
from .validate import ValidationError, prompt_ids, reference_logits, validate_onnx

EXPORTER_VERSION = 4  # bump when the ONNX produced for the same inputs changes (4: logits_positions input)
DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "model_repository"
DEVICES = ("cpu", "cuda")
RUNTIMES = ("onnx", "torch")  # onnx (default): ONNX Runtime branches; torch: HF folders for torch_lm
HF_DIR = "hf"  # the HF folder inside a torch-runtime branch directory
LIGHT_QUANT_CHOICES = (quantize.AUTO, *quantize.QUANT_MODES, "none")
BENCH_PAST = 128  # past length of the decode-step timings of --light-quant auto
BENCH_WARMUP, BENCH_REPEATS = 2, 10  # untimed, timed steps per timing (median)
STAMP = "stamp.json"
TOKENIZER_DIR = "tokenizer"
CPU_FP32_NOTE = ("heavy is FP32 on CPU: ONNX Runtime has no fast FP16 CPU kernels; "
                 "FP16 is used with --device cuda")


class TokenizerMismatch(ValueError):
    """Heavy and light tokenizers differ (message says what differs)."""


@dataclass(frozen=True)
class ExportOptions:
    """Options of one export; defaults are the CLI defaults."""

    device: str = "cpu"  # cpu: heavy FP32; cuda: heavy FP16 (KV float16)
    runtime: str = "onnx"  # onnx | torch (see the module docstring)
    light_quant: str = quantize.DEFAULT_MODE  # see export.quantize; auto: timed pick; "none": light FP32
    threads: int = 0  # ONNX Runtime intra-op threads per branch (0 = ORT default)
    skip_validation: bool = False
    max_context: int = 0  # 0 = min of the two models' max_position_embeddings
    template: Path | None = DEFAULT_TEMPLATE  # None: build the ONNX branches only
    work_dir: Path | None = None  # None: default_work_dir(OUT)
    router: Path | None = None  # a learned router (train-router) shipped as router/1/router.json
    train_router: bool = False  # build a default router for this pair from generated verify logs
    router_tokens: int = router_build.RouterBuildOptions.max_tokens  # new tokens per training prompt
    router_threshold: float | None = None  # the repository's P(disagree) bar; None: the router file's own

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}; got {self.device!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"--runtime must be one of {RUNTIMES}; got {self.runtime!r}")
        if self.light_quant not in LIGHT_QUANT_CHOICES:
            raise ValueError(f"--light-quant must be one of {LIGHT_QUANT_CHOICES}; got {self.light_quant!r}")
        if self.train_router:
            router_build.RouterBuildOptions(self.router_tokens)  # range check
            if self.router is not None:
                raise ValueError("--train-router builds the router: do not also give --router")
            if self.runtime != "onnx" or self.template is None:
                raise ValueError("--train-router needs --runtime onnx and a repository (not --onnx-only)")
        if self.router_threshold is not None:
            if not 0.0 <= self.router_threshold <= 1.0:
                raise ValueError(f"--router-threshold must be in [0, 1]; got {self.router_threshold}")
            if self.router is None and not self.train_router:
                raise ValueError("--router-threshold needs a learned router (--router or --train-router)")


@dataclass
class BranchBuild:
    """What the branch export did (kept in its stamp and in export.json)."""

    role: str
    directory: str
    source: str
    precision: str
    onnx_bytes: int = 0
    load_s: float = 0.0
    export_s: float = 0.0
    quantize_s: float = 0.0
    validation: dict | None = None
    quant_candidates: dict = field(default_factory=dict)
    quant_reason: str = ""  # light: why this quantization (default, requested, or auto's timings)
    notes: list = field(default_factory=list)
    skipped: bool = False


def _stamp_key(source: Source, role: str, options: ExportOptions) -> str:
    shaping = {"v": EXPORTER_VERSION, "role": role, "src": fingerprint(source), "device": options.device,
               "validate": not options.skip_validation, "deps": versions.dependency_versions()}
    if role == "light":
        shaping["quant"] = [options.light_quant, quantize.AUTO_AGREEMENT_SLACK, quantize.NBITS_BLOCK_SIZE,
                            quantize.NBITS_ACCURACY_LEVEL]
        if options.light_quant in quantize.MIN_ROWS or options.light_quant == quantize.AUTO:
            shaping["quant"].append(sorted(quantize.ACCURACY_LEVEL.items()))  # modes added later: own stamps
    if options.runtime != "onnx":  # onnx stamps stay as they were before runtimes existed
        shaping["runtime"] = options.runtime
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def _reuse(branch_dir: Path, key: str) -> BranchBuild | None:
    stamp = branch_dir / STAMP
    if not stamp.is_file() or not (onnx_files(branch_dir) or (branch_dir / HF_DIR / "config.json").is_file()):
        return None
    data = json.loads(stamp.read_text())
    if data.get("key") != key:
        return None
    return BranchBuild(**{**data["build"], "skipped": True})


def _save_stamp(branch_dir: Path, key: str, build: BranchBuild) -> None:
    (branch_dir / STAMP).write_text(json.dumps({"key": key, "build": asdict(build)}, indent=2) + "\n")


def _fresh(path: Path) -> Path:
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
        export_model(model, _fresh(out_dir), half=half)
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
    key = _stamp_key(source, role, options)
    reused = _reuse(out_dir, key)
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
    _fresh(out_dir)
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
    _save_stamp(out_dir, key, build)
    return build


def export_heavy(source: Source, tokenizer, work: Path, options: ExportOptions) -> BranchBuild:
    """Heavy branch: FP32 (cpu) or FP16 (cuda), validated."""
    if options.runtime == "torch":
        return export_torch_branch(source, tokenizer, work, "heavy", options)
    out_dir = work / "heavy"
    key = _stamp_key(source, "heavy", options)
    reused = _reuse(out_dir, key)
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
    _save_stamp(out_dir, key, build)
    return build


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


def export_light(source: Source, tokenizer, work: Path, options: ExportOptions) -> BranchBuild:
    """Light branch: FP32 export, then INT8 per ``options.light_quant`` (auto: timed pick)."""
    if options.runtime == "torch":
        return export_torch_branch(source, tokenizer, work, "light", options)
    out_dir = work / "light"
    key = _stamp_key(source, "light", options)
    reused = _reuse(out_dir, key)
    if reused:
        return reused
    fp32_dir = work / "light-fp32"
    build = BranchBuild("light", str(out_dir), str(source.path), "fp32")
    prompts, refs = _export_fp(source, tokenizer, fp32_dir, False, build)
    if options.light_quant == "none":
        _fresh(out_dir)
        for f in onnx_files(fp32_dir) + [fp32_dir / INFO_FILE]:
            shutil.move(str(f), out_dir / f.name)
        if not options.skip_validation:
            with progress.stage("light", "validate against transformers"):
                build.validation = validate_onnx(out_dir, refs, prompts, "fp32", options.device).to_dict()
        build.quant_reason = "requested with --light-quant none: the light branch stays FP32"
    else:
        _quantize_and_pick(fp32_dir, out_dir, refs, prompts, options, build)
    shutil.rmtree(fp32_dir, ignore_errors=True)
    build.onnx_bytes = onnx_bytes(out_dir)
    _save_stamp(out_dir, key, build)
    return build


def _quantize_and_pick(fp32_dir, out_dir, refs, prompts, options, build: BranchBuild) -> None:
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


def check_tokenizers(heavy_tok, light_tok) -> None:
    diffs = tokenizer_differences(heavy_tok, light_tok)
    if diffs:
        raise TokenizerMismatch("heavy and light must share one tokenizer: " + "; ".join(diffs))


def save_tokenizer(tokenizer, work: Path) -> Path:
    out = _fresh(work / TOKENIZER_DIR)
    tokenizer.save_pretrained(out)
    return out


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


KV_BUDGET_MB = {"heavy": 2048, "light": 1024}  # kv_cache_budget_mb written into the branch configs
KV_GROWTH_SLACK = 1.25  # a session's buffer may be up to this much larger than its tokens (kv_store)


def kv_budget_values(h_info: ModelInfo, l_info: ModelInfo) -> dict:
    """Both branches' KV budgets and the router's max_live_tokens: the live tokens both can hold."""
    fits = min(KV_BUDGET_MB[role] * (1 << 20) / (info.kv_bytes_per_token() * KV_GROWTH_SLACK)
               for role, info in (("heavy", h_info), ("light", l_info)))
    return {"heavy_kv_budget_mb": KV_BUDGET_MB["heavy"], "light_kv_budget_mb": KV_BUDGET_MB["light"],
            "max_live_tokens": int(fits)}


def default_work_dir(out: Path) -> Path:
    """Beside OUT, hidden, so Triton never sees it as a model: ``.<name>.build``."""
    return out.parent / f".{out.name}.build"


def export_pair(heavy_src, light_src, out, options: ExportOptions = ExportOptions()) -> dict:
    """Export a pair; returns the export report (also OUT/export.json when a template is used)."""
    t0 = time.perf_counter()
    if options.router:
        LearnedRouter.load(options.router)  # refuse a bad router file before the long export
    heavy_source, light_source = resolve_source(heavy_src), resolve_source(light_src)
    with progress.stage("tokenizer", "load and compare heavy/light"):
        tokenizer = load_tokenizer(heavy_source)
        light_tokenizer = load_tokenizer(light_source)
    check_tokenizers(tokenizer, light_tokenizer)
    out = Path(out).expanduser()
    work = Path(options.work_dir).expanduser() if options.work_dir else default_work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    tok_dir = save_tokenizer(tokenizer, work)
    heavy = export_heavy(heavy_source, tokenizer, work, options)
    light = export_light(light_source, tokenizer, work, options)
    end_ids = document_end_ids(heavy_source, tokenizer)
    values = placeholder_values(heavy, light, tokenizer, work, options, end_ids)
    report = {"exporter_version": EXPORTER_VERSION, "dependencies": versions.dependency_versions(),
              "options": {k: str(v) for k, v in asdict(options).items()},
              "light_quantization": {"mode": light.precision, "reason": light.quant_reason},
              "placeholders": values, "heavy": asdict(heavy), "light": asdict(light),
              "total_s": round(time.perf_counter() - t0, 2)}
    if options.template is not None:
        with progress.stage("repository", f"fill {out}"):
            fill_repository(options.template, out, values, {"heavy": work / "heavy", "light": work / "light"},
                            tok_dir, report)
            if options.router:
                place_router(options.router, out)
        if options.train_router:
            with progress.stage("router", f"train on verify logs of {len(router_prompts.training_prompts())} prompts"):
                built = router_build.build_router(
                    work, tokenizer, tok_dir / "tokenizer.json", end_ids, out / "router" / "1",
                    options.device, options.threads, router_build.RouterBuildOptions(options.router_tokens))
            report["router"] = dict(built.router.trained)
            write_report(out / EXPORT_REPORT, report)  # again, now with the router's provenance
    else:
        write_report(work / EXPORT_REPORT, report)
    return report


ROUTER_FILE = router_build.ROUTER_FILE  # router_file of an export with a router (read from router/1/)


def place_router(path: Path, out: Path) -> None:
    """Check a learned router file and copy it into the router's version directory."""
    LearnedRouter.load(path)  # a file for other features is refused here, not at serve time
    shutil.copyfile(path, out / "router" / "1" / ROUTER_FILE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``tokenrouter export``."""
    parser.add_argument("--heavy", required=True, help="heavy model: HF folder or .gguf file")
    parser.add_argument("--light", required=True, help="light model: HF folder or .gguf file (same tokenizer)")
    parser.add_argument("--out", required=True, type=Path, help="model repository to write")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cpu: heavy FP32 (no fast FP16 CPU kernels in ONNX Runtime); cuda: heavy FP16")
    parser.add_argument("--runtime", choices=RUNTIMES, default="onnx",
                        help="onnx: ONNX branches (default); torch: HF folders run by torch (KV on the GPU)")
    parser.add_argument("--light-quant", choices=LIGHT_QUANT_CHOICES, default=quantize.DEFAULT_MODE,
                        help=f"light quantization (default {quantize.DEFAULT_MODE}: batch-invariant); "
                             "auto = fastest at equal top-1 agreement, timed on this machine")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads per branch (0 = default)")
    parser.add_argument("--max-context", type=int, default=0, help="0 = the models' max positions")
    parser.add_argument("--skip-validation", action="store_true", help="do not compare with transformers")
    parser.add_argument("--router", type=Path, default=None,
                        help="learned router (tokenrouter train-router) to ship; router_file points at it")
    parser.add_argument("--train-router", action="store_true",
                        help="build a default learned router for this pair: verify logs of the exporter's own "
                             "prompts, trained as train-router does (minutes on a CPU; router/1/router_report.txt)")
    parser.add_argument("--router-tokens", type=int, default=router_build.RouterBuildOptions.max_tokens,
                        help="with --train-router: new tokens per training prompt, 8-512 (default: %(default)s)")
    parser.add_argument("--router-threshold", type=float, default=None,
                        help="the repository's P(disagree) bar for its learned router, in [0, 1] (config "
                             "parameter router_threshold; default: the router file's own)")
    parser.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE, help="model repository template")
    parser.add_argument("--onnx-only", action="store_true", help="build the ONNX branches only, no repository")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where branch ONNX is built (default .OUT.build beside OUT)")
    parser.add_argument("--log", type=Path, default=None,
                        help="file for the libraries' warnings and progress bars "
                             "(default <data>/logs/export-<time>-<pid>.log)")


def run(args: argparse.Namespace) -> int:
    """Entry of ``tokenrouter export``; returns the exit status."""
    try:
        options = ExportOptions(
            device=args.device, runtime=args.runtime, light_quant=args.light_quant, threads=args.threads,
            skip_validation=args.skip_validation, max_context=args.max_context,
            template=None if args.onnx_only else args.template, work_dir=args.work_dir, router=args.router,
            train_router=args.train_router, router_tokens=args.router_tokens,
            router_threshold=args.router_threshold,
        )
        log = progress.ExportLog(args.log or progress.default_log_path())
        with progress.active(log):
            report = export_pair(args.heavy, args.light, args.out, options)
    except (TokenizerMismatch, ValidationError, ValueError, FileNotFoundError) as err:
        print(f"tokenrouter export: {err}", file=sys.stderr)
        return 1
    for role in ("heavy", "light"):
        b = report[role]
        state = "up to date" if b["skipped"] else f"exported in {b['export_s']} s"
        print(f"{role}: {b['precision']} ({options.runtime}), {b['onnx_bytes'] / 1e6:.1f} MB, {state}")
    print(f"wrote {args.out}")
    if log.noise_lines:
        print(f"library output ({log.noise_lines} lines: warnings, progress bars): {log.path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tokenrouter export", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
