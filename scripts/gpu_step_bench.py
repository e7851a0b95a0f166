"""Step times of exported branch models on one device: the GPU check's short bench.

For each model directory (model.onnx + model.json) it times OnnxCausalLM.forward for a
1-token decode step at batch 1 and 8 and a 5-token verify step at batch 1, past length
PAST_LEN, median of REPEATS after WARMUP runs. Prints one line per model and case and, with
--json, writes them to a file.

    python3 scripts/gpu_step_bench.py --device cuda DIR [DIR ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM  # noqa: E402

PAST_LEN = 128  # cached tokens before the timed step
WARMUP = 3  # untimed runs (CUDA/TensorRT build kernels on the first ones)
REPEATS = 20  # timed runs; the median is reported
CASES = (("decode b1", 1, 1), ("decode b8", 8, 1), ("verify5 b1", 1, 5))  # name, batch, tokens


def time_case(lm: OnnxCausalLM, batch: int, new: int) -> float:
    info = lm.info
    shape = (batch, info.num_kv_heads, PAST_LEN, info.head_dim)
    rng = np.random.default_rng(0)
    past = [(rng.standard_normal(shape).astype(info.np_kv_dtype),
             rng.standard_normal(shape).astype(info.np_kv_dtype)) for _ in range(info.num_layers)]
    ids = rng.integers(0, info.vocab_size, size=(batch, new), dtype=np.int64)
    mask = np.ones((batch, PAST_LEN + new), dtype=np.int64)
    pos = np.tile(np.arange(PAST_LEN, PAST_LEN + new, dtype=np.int64), (batch, 1))
    times = []
    for i in range(WARMUP + REPEATS):
        t0 = time.perf_counter()
        lm.forward(ids, mask, pos, past)
        if i >= WARMUP:
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dirs", nargs="+", type=Path)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda", "tensorrt"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for model_dir in args.model_dirs:
        lm = OnnxCausalLM(model_dir, device=args.device)
        used = lm.session.get_providers()[0]
        for name, batch, new in CASES:
            ms = time_case(lm, batch, new)
            rows.append({"model": str(model_dir), "precision": lm.info.precision,
                         "provider": used, "case": name, "median_ms": round(ms, 3)})
            print(f"{model_dir}  {lm.info.precision:>14}  {used:<26} {name:<11} {ms:9.3f} ms")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
