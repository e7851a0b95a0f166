"""The tiny test pair: shape, shared tokenizer, determinism stamp, realistic agreement."""
from __future__ import annotations

import json

import pytest
import torch

from tokenrouter_backend.export.tiny_pair import STAMP, build_tiny_pair, corpus_text, is_built

MIN_AGREEMENT = 0.30  # heavy/light top-1 agreement on training text (measured ~0.5)


@pytest.fixture(scope="module")
def models(tiny_pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    heavy_dir, light_dir = tiny_pair
    tok = AutoTokenizer.from_pretrained(heavy_dir)
    return tok, AutoModelForCausalLM.from_pretrained(heavy_dir), AutoModelForCausalLM.from_pretrained(light_dir)


def test_pair_layout(tiny_pair):
    for d in tiny_pair:
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (d / name).is_file(), f"{d / name} missing"
    assert (tiny_pair[0] / "tokenizer.json").read_bytes() == (tiny_pair[1] / "tokenizer.json").read_bytes()


def test_models_are_gqa_qwen2_and_heavy_is_bigger(models):
    tok, heavy, light = models
    for m in (heavy, light):
        assert type(m).__name__ == "Qwen2ForCausalLM"
        assert m.config.num_key_value_heads < m.config.num_attention_heads
        assert m.config.vocab_size == len(tok)
    assert sum(p.numel() for p in heavy.parameters()) > 2 * sum(p.numel() for p in light.parameters())
    assert tok.eos_token is not None and tok.eos_token_id == heavy.config.eos_token_id


def test_pair_agrees_on_many_tokens(models):
    tok, heavy, light = models
    ids = torch.tensor([tok(corpus_text())["input_ids"][2000:2512]])
    with torch.no_grad():
        agree = (heavy(ids).logits.argmax(-1) == light(ids).logits.argmax(-1)).float().mean().item()
    print(f"tiny pair top-1 agreement: {agree:.3f}")
    assert agree >= MIN_AGREEMENT


def test_second_build_is_skipped(tiny_pair):
    root = tiny_pair[0].parent
    assert is_built(root)
    before = (tiny_pair[0] / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_pair(root) == tiny_pair
    assert (tiny_pair[0] / "model.safetensors").stat().st_mtime_ns == before
    assert "build_s" in json.loads((root / STAMP).read_text())
