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
import shutil
import sys
import time
from pathlib import Path

from tokenrouter_backend.core.signals.learned_router import LearnedRouter
from tokenrouter_backend.learning import router_prompts

from . import progress, quantize, router_build
from .branch_export import export_heavy, export_light, fresh_dir
from .options import DEFAULT_TEMPLATE, DEVICES, LIGHT_QUANT_CHOICES, RUNTIMES, ExportOptions
from .repository import EXPORT_REPORT, fill_repository, write_report
from .repository_values import ROUTER_FILE, export_report, placeholder_values
from .sources import document_end_ids, load_tokenizer, resolve_source, tokenizer_differences
from .validate import ValidationError

TOKENIZER_DIR = "tokenizer"
DEFAULT_OPTIONS = ExportOptions()  # export_pair's default: the CLI defaults (frozen)


class TokenizerMismatch(ValueError):
    """Heavy and light tokenizers differ (message says what differs)."""


def check_tokenizers(heavy_tok, light_tok) -> None:
    diffs = tokenizer_differences(heavy_tok, light_tok)
    if diffs:
        raise TokenizerMismatch("heavy and light must share one tokenizer: " + "; ".join(diffs))


def save_tokenizer(tokenizer, work: Path) -> Path:
    out = fresh_dir(work / TOKENIZER_DIR)
    tokenizer.save_pretrained(out)
    return out


def default_work_dir(out: Path) -> Path:
    """Beside OUT, hidden, so Triton never sees it as a model: ``.<name>.build``."""
    return out.parent / f".{out.name}.build"


def export_pair(heavy_src, light_src, out, options: ExportOptions = DEFAULT_OPTIONS) -> dict:
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
    report = export_report(options, heavy, light, values, round(time.perf_counter() - t0, 2))
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
