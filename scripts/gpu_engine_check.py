"""Engine-level GPU check on the torch runtime (no Triton): lossless verify, step times, bench.

1. lossless: the exported tiny pair (``--repo``, torch runtime) through the real block loop
   (``LocalPair``: ``InProcessBranch`` over ``BranchEngine(TorchCausalLM)``): verify output
   must equal heavy-only greedy token for token on every prompt; route is run and reported.
2. step times: one decode step (1 token) at batch 1 and 8 and a 5-token verify step at
   batch 1, past PAST_LEN, median of REPEATS: heavy vs light of the tiny pair and, with
   ``--shapes``, of randomly initialised Qwen2-shaped models (random weights: their
   agreement numbers mean nothing, their timings are real).
3. bench: tokens/s of heavy, verify and route for a few prompts (tiny pair, and the random
   pair when timed).

Writes a JSON report (``--json``) and prints a text summary. Exit 1 when verify != heavy.

    python3 scripts/gpu_engine_check.py --repo REPO --device cuda --shapes 0.5b,1.5b --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tokenrouter_backend.branches.local_pair import LocalPair  # noqa: E402
from tokenrouter_backend.engine.step_timing import step_ms  # noqa: E402
from tokenrouter_backend.engine.torch_lm import TorchCausalLM  # noqa: E402

PAST_LEN = 128  # cached tokens before a timed step
REPEATS = 20  # timed steps per case (median)
BENCH_TOKENS = 64  # generated tokens per bench request
PROMPT_IDS = [[5, 17, 230, 41, 99, 12, 7], [300, 301, 2, 9], list(range(40, 72)), [11, 22, 33, 44, 55, 66]]
CASES = (("decode b1", 1, 1), ("decode b8", 8, 1), ("verify5 b1", 1, 5))  # name, batch, new tokens


@dataclass(frozen=True)
class Shape:
    """Qwen2 dimensions of a random model (heavy ~1.5B, light ~0.5B: Qwen2.5 presets)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151936


SHAPES = {
    "1.5b": Shape(1536, 28, 12, 2, 8960),
    "0.5b": Shape(896, 24, 14, 2, 4864),
    "mini": Shape(256, 4, 4, 2, 688, vocab=4096),  # a CPU-sized stand-in that runs the same code
}


def random_lm(shape: Shape, device: str, dtype: str, seed: int) -> TorchCausalLM:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=4096,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):  # initialise directly on the device (seconds, not minutes)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    return TorchCausalLM(device=device, dtype=dtype, model=model)


def lossless(pair: LocalPair, max_tokens: int) -> dict:
    rows, ok = [], True
    for i, prompt in enumerate(PROMPT_IDS):
        heavy, _ = pair.generate(prompt, "heavy", session_id=10 + i, max_tokens=max_tokens)
        verify, vstats = pair.generate(prompt, "verify", session_id=20 + i, max_tokens=max_tokens)
        route, rstats = pair.generate(prompt, "route", session_id=30 + i, max_tokens=max_tokens)
        same = heavy == verify
        ok &= same
        rows.append({"prompt": i, "verify_equals_heavy": same, "drafts_accepted": vstats.drafts_accepted,
                     "drafts_proposed": vstats.drafts_proposed,
                     "route_agreement": sum(a == b for a, b in zip(heavy, route)) / len(heavy),
                     "route_light_share": round(rstats.light_share, 3)})
    return {"passed": ok, "prompts": rows}


def step_times(name: str, lm) -> list[dict]:
    out = []
    for case, batch, new in CASES:
        ms = step_ms(lm, batch, PAST_LEN, new, repeats=REPEATS)
        out.append({"model": name, "precision": lm.info.precision, "case": case, "median_ms": round(ms, 3)})
    return out


def bench(pair: LocalPair, tokens: int) -> dict:
    out = {}
    pair.generate(PROMPT_IDS[0], "heavy", session_id=99, max_tokens=8)  # warm up both branches
    pair.generate(PROMPT_IDS[0], "verify", session_id=99, max_tokens=8)
    for mode in ("heavy", "verify", "route"):
        made, t0 = 0, time.perf_counter()
        for i, prompt in enumerate(PROMPT_IDS):
            got, _ = pair.generate(prompt, mode, session_id=100 + i, max_tokens=tokens)
            made += len(got)
        out[mode] = round(made / (time.perf_counter() - t0), 1)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="model repository exported with --runtime torch")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", default="", help="random Qwen2 pair heavy,light from " + ",".join(SHAPES))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    dtype = "float16" if args.device == "cuda" else "float32"
    heavy = TorchCausalLM(args.repo / "heavy" / "1", device=args.device, dtype=dtype)
    light = TorchCausalLM(args.repo / "light" / "1", device=args.device, dtype=dtype)
    tiny = LocalPair.of(light, heavy)
    report = {"device": args.device, "dtype": dtype, "past_len": PAST_LEN, "repeats": REPEATS}
    report["lossless"] = lossless(tiny, args.max_tokens)
    report["steps"] = step_times("tiny heavy", heavy) + step_times("tiny light", light)
    report["bench_tiny_tok_s"] = bench(tiny, BENCH_TOKENS)
    print_part("lossless (tiny pair)", report["lossless"])
    if args.shapes:
        h_name, l_name = args.shapes.split(",")
        t0 = time.perf_counter()
        big_h = random_lm(SHAPES[h_name], args.device, dtype, seed=1)
        big_l = random_lm(SHAPES[l_name], args.device, dtype, seed=2)
        report["random_build_s"] = round(time.perf_counter() - t0, 1)
        report["steps"] += step_times(f"random {h_name} heavy", big_h) + step_times(f"random {l_name} light", big_l)
        report["bench_random_tok_s"] = bench(LocalPair.of(big_l, big_h), BENCH_TOKENS // 2)
        report["random_note"] = "random weights: timings real, agreement/acceptance meaningless"
    for row in report["steps"]:
        print(f"step  {row['model']:<22} {row['precision']:>5} {row['case']:<11} {row['median_ms']:9.3f} ms")
    for key in ("bench_tiny_tok_s", "bench_random_tok_s"):
        if key in report:
            print(f"bench {key}: " + ", ".join(f"{m} {v} tok/s" for m, v in report[key].items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["lossless"]["passed"] else 1


def print_part(title: str, part: dict) -> None:
    print(f"{title}: {'PASS' if part['passed'] else 'FAIL'}")
    for row in part["prompts"]:
        print(f"  prompt {row['prompt']}: verify==heavy {row['verify_equals_heavy']}, accepted "
              f"{row['drafts_accepted']}/{row['drafts_proposed']}, route agreement {row['route_agreement']:.2f}, "
              f"route light share {row['route_light_share']}")


if __name__ == "__main__":
    sys.exit(main())
