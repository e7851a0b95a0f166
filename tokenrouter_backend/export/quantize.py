"""Light-branch quantization of an exported FP32 ONNX model (onnxruntime.quantization).

Modes (``--light-quant``):
  matmulnbits4            weight-only: 4-bit symmetric blockwise weights in MatMulNBits,
                          FP32 activations and compute (accuracy_level 1), so a row's logits
                          do not depend on the other rows of the batch; ONNX Runtime's CPU has
                          a fast FP32-compute kernel for 4-bit weights
  matmulnbits4-int8       (default) 4-bit weights as above, int8 activations and compute
                          (accuracy_level 4, one scale per block of a row): a decode step about
                          half matmulnbits4's on an AVX2 CPU. ONNX Runtime runs a single-row product (M = 1) on another
                          kernel path than M >= 2, whose rows do not depend on each other; the
                          model declares ``min_rows`` 2 and ``OnnxCausalLM`` pads a one-row
                          forward to two, so it stays batch-invariant
  matmulnbits8            the same with 8-bit weights: batch-invariant and closer to FP32, but
                          ONNX Runtime's CPU kernel for 8-bit weights with FP32 compute is slow
                          (measured 17x slower than FP32 on the demo light model)
  dynamic                 quantize_dynamic, INT8 weights per tensor (MatMulInteger, DynamicQuantizeLinear)
  dynamic-per-channel     quantize_dynamic, INT8 weights per output channel
  auto                    build matmulnbits4, matmulnbits4-int8 and the two dynamic modes, keep the fastest decode
                          step among those whose top-1 agreement with FP32 is within
                          AUTO_AGREEMENT_SLACK of the best one

The two ``dynamic`` modes are BATCH-DEPENDENT: DynamicQuantizeLinear takes one activation
scale over the whole batch tensor (padding rows included), so a request's light tokens and
probabilities change with whatever else is in the batch, against the branch protocol's
promise. They stay available (and ``auto`` may pick one) for users who trade that for speed;
the default never depends on timings taken on the export machine. Measured numbers and the
reasoning are in research/notebook/2026-12-01-light-quant.md and
research/notebook/2026-12-03-light-quant-int8-compute.md.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tokenrouter_backend.engine.onnx_lm import INFO_FILE, MODEL_FILE, ModelInfo

from .onnx_export import DATA_FILE, EXTERNAL_DATA_BYTES

QUANT_MODES = ("matmulnbits4", "matmulnbits4-int8", "matmulnbits8", "dynamic", "dynamic-per-channel")
DEFAULT_MODE = "matmulnbits4-int8"
AUTO = "auto"
# what `auto` builds and times: matmulnbits8 is left out (its CPU kernel makes a timed step take seconds)
AUTO_MODES = ("matmulnbits4", "matmulnbits4-int8", "dynamic", "dynamic-per-channel")
PRECISION_NAMES = {
    "dynamic": "int8-dynamic",
    "dynamic-per-channel": "int8-dynamic-per-channel",
    "matmulnbits8": "int8-matmulnbits",
    "matmulnbits4": "int4-matmulnbits",
    "matmulnbits4-int8": "int4-matmulnbits-int8",
}
NBITS = {"matmulnbits4": 4, "matmulnbits4-int8": 4, "matmulnbits8": 8}  # weight bits of the MatMulNBits modes
BATCH_INVARIANT = {"matmulnbits4": True, "matmulnbits4-int8": True, "matmulnbits8": True, "dynamic": False,
                   "dynamic-per-channel": False}
NBITS_BLOCK_SIZE = 32  # weights per scale in MatMulNBits
# 1 = FP32 compute on de-quantized weights: batch-invariant. 4 = int8 activations per block of a
# row: rows are independent for M >= 2, but M = 1 takes another kernel path (on the demo 0.5B a
# decode step's logits moved by 0.41 between M = 1 and M = 4; M = 2, 3, 4 and 8 vs 32 were equal),
# hence MIN_ROWS: OnnxCausalLM pads a one-row forward to two (research/notebook/2026-12-03-light-quant-int8-compute.md)
NBITS_ACCURACY_LEVEL = 1
ACCURACY_LEVEL = {"matmulnbits4": NBITS_ACCURACY_LEVEL, "matmulnbits8": NBITS_ACCURACY_LEVEL, "matmulnbits4-int8": 4}
MIN_ROWS = {"matmulnbits4-int8": 2}  # rows every MatMul of the model needs to take its batch-invariant path
AUTO_AGREEMENT_SLACK = 0.05  # "equal agreement": within 5 points of the best mode (see pick_fastest)
DEFAULT_REASON = ("default: 4-bit MatMulNBits weights with int8 compute, half matmulnbits4's decode step on an "
                  "AVX2 CPU; a one-row forward runs as two rows (min_rows), so a session's tokens do not depend "
                  "on the batch (docs/benchmarks.md)")


def _has_data(src_dir: Path) -> bool:
    return (Path(src_dir) / DATA_FILE).exists()


def quantize_dynamic_int8(src_dir: Path, dst_dir: Path, per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(Path(src_dir) / MODEL_FILE), str(Path(dst_dir) / MODEL_FILE),
        per_channel=per_channel, weight_type=QuantType.QInt8,
        use_external_data_format=_has_data(src_dir),
        extra_options={"MatMulConstBOnly": True},
    )


def quantize_nbits(src_dir: Path, dst_dir: Path, bits: int, accuracy_level: int = NBITS_ACCURACY_LEVEL) -> None:
    """Blockwise quantization of every MatMul with constant weights (MatMulNBits)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(
        str(Path(src_dir) / MODEL_FILE), bits=bits, block_size=NBITS_BLOCK_SIZE,
        is_symmetric=True, accuracy_level=accuracy_level,
    )
    quant.process()
    out = Path(dst_dir) / MODEL_FILE
    large = _has_data(src_dir) or quant.model.model.ByteSize() > EXTERNAL_DATA_BYTES
    quant.model.save_model_to_file(str(out), use_external_data_format=large)


def quantize_light(src_dir: Path, dst_dir: Path, mode: str) -> ModelInfo:
    """Quantize src_dir (FP32 export) into dst_dir with ``mode``; writes and returns model.json."""
    if mode not in QUANT_MODES:
        raise ValueError(f"light quantization mode must be one of {QUANT_MODES} or {AUTO!r}; got {mode!r}")
    dst_dir = Path(dst_dir)
    if dst_dir.exists():
        shutil.rmtree(dst_dir)
    dst_dir.mkdir(parents=True)
    if mode in NBITS:
        quantize_nbits(src_dir, dst_dir, NBITS[mode], ACCURACY_LEVEL[mode])
    else:
        quantize_dynamic_int8(src_dir, dst_dir, per_channel=(mode == "dynamic-per-channel"))
    info = ModelInfo.load(Path(src_dir) / INFO_FILE)
    info = ModelInfo(**{**info.__dict__, "precision": PRECISION_NAMES[mode], "min_rows": MIN_ROWS.get(mode, 1)})
    info.save(dst_dir / INFO_FILE)
    return info


def pick_fastest(results: dict[str, dict]) -> str:
    """results: mode -> {"top1_agreement": float, "step_ms_b1": float, "step_ms_b8": float}.

    Among modes within AUTO_AGREEMENT_SLACK of the best agreement, the lowest
    step_ms_b1 + step_ms_b8 (one live session and a busy server both count).
    """
    best = max(r["top1_agreement"] for r in results.values())
    ok = [m for m, r in results.items() if r["top1_agreement"] >= best - AUTO_AGREEMENT_SLACK]
    return min(ok, key=lambda m: results[m]["step_ms_b1"] + results[m]["step_ms_b8"])


def auto_reason(results: dict[str, dict], chosen: str) -> str:
    """Why ``auto`` chose ``chosen``: every candidate's agreement and timings, and the rule."""
    facts = ", ".join(f"{m} top-1 {r['top1_agreement']:.3f} b1 {r['step_ms_b1']} ms b8 {r['step_ms_b8']} ms"
                      for m, r in results.items())
    variant = "" if BATCH_INVARIANT[chosen] else "; note: this mode is batch-dependent"
    return (f"auto: fastest (b1 + b8 decode-step ms on this machine) within {AUTO_AGREEMENT_SLACK:.2f} "
            f"of the best top-1 agreement: {chosen} ({facts}){variant}")
