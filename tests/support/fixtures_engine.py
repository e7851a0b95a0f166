"""Fakes and fixtures for the branch engine tests (import these; conftest.py is owned elsewhere).

``ToyLM`` is a deterministic numpy causal LM with real attention over its KV: every new
token's key/value in layer l > 0 depends on the whole (masked) prefix, so a wrong mask, wrong
position ids, stale KV after truncation or garbage padding changes its outputs.
``tiny_qwen_onnx`` exports a random tiny ``Qwen2ForCausalLM`` per docs/architecture.md
(a stand-in until the exporter lands; not a library exporter).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenrouter_backend.engine.onnx_lm import ModelInfo


class ToyLM:
    """A 2-layer numpy attention LM with the ``OnnxCausalLM.forward`` signature."""

    def __init__(self, vocab: int = 50, heads: int = 2, head_dim: int = 8, layers: int = 2,
                 max_positions: int = 64, seed: int = 0, sharpness: float = 3.0):
        self.info = ModelInfo(num_layers=layers, num_kv_heads=heads, head_dim=head_dim,
                              vocab_size=vocab, max_position_embeddings=max_positions)
        rng = np.random.default_rng(seed)
        width = heads * head_dim
        self.embed = rng.standard_normal((vocab, width)).astype(np.float32)
        self.pos = rng.standard_normal((max_positions, width)).astype(np.float32)
        self.wk = rng.standard_normal((layers, width, width)).astype(np.float32) / np.sqrt(width)
        self.wv = rng.standard_normal((layers, width, width)).astype(np.float32) / np.sqrt(width)
        self.out = rng.standard_normal((width, vocab)).astype(np.float32) * sharpness / np.sqrt(width)
        self.calls: list[tuple[int, int, int]] = []  # (batch, past_len, new_len) per forward

    def empty_past(self, batch: int):
        i = self.info
        z = np.zeros((batch, i.num_kv_heads, 0, i.head_dim), dtype=np.float32)
        return [(z, z) for _ in range(i.num_layers)]

    def _split(self, x: np.ndarray) -> np.ndarray:  # [B, S, H*D] -> [B, H, S, D]
        b, s, _ = x.shape
        return x.reshape(b, s, self.info.num_kv_heads, self.info.head_dim).transpose(0, 2, 1, 3)

    def forward(self, input_ids, attention_mask, position_ids, past, logits_positions=None):
        batch, new = input_ids.shape
        past_len = past[0][0].shape[2]
        assert attention_mask.shape == (batch, past_len + new)
        self.calls.append((batch, past_len, new))
        x = self.embed[input_ids] + self.pos[position_ids]  # [B, S, W]
        # key j visible to query i: mask 1 and j <= past_len + i (causal)
        causal = np.arange(past_len + new)[None, :] <= past_len + np.arange(new)[:, None]
        visible = causal[None, None] & (attention_mask[:, None, None, :] == 1)  # [B,1,S,P+S]
        new_kv = []
        for layer, (pk, pv) in enumerate(past):
            k = self._split(np.tanh(x @ self.wk[layer]))
            v = self._split(np.tanh(x @ self.wv[layer]))
            keys = np.concatenate([pk, k], axis=2)
            vals = np.concatenate([pv, v], axis=2)
            scores = np.einsum("bhsd,bhtd->bhst", k, keys) * 2.0
            scores = np.where(visible, scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            w = np.exp(scores)
            w /= w.sum(axis=-1, keepdims=True)
            h = np.einsum("bhst,bhtd->bhsd", w, vals)  # [B, H, S, D]
            x = x + h.transpose(0, 2, 1, 3).reshape(batch, new, -1)
            new_kv.append((k.astype(np.float32), v.astype(np.float32)))
        logits = (x @ self.out).astype(np.float32)
        if logits_positions is not None:
            logits = np.take_along_axis(logits, np.asarray(logits_positions)[:, :, None], axis=1)
        return logits, new_kv


@pytest.fixture
def toy_lm() -> ToyLM:
    return ToyLM()


def export_tiny_qwen(out_dir: Path, seed: int = 0, max_positions: int = 256, **sizes) -> Path:
    """Random tiny Qwen2ForCausalLM -> out_dir/model.onnx + model.json (architecture.md I/O).

    ``sizes`` override the Qwen2Config fields (vocab_size, hidden_size, num_hidden_layers, ...).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(seed)
    fields = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    cfg = Qwen2Config(**{**fields, **sizes}, max_position_embeddings=max_positions,
                      tie_word_embeddings=False, attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg).eval()
    layers, heads, head_dim = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads

    class Flat(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
            s = input_ids.shape[1]
            kv = []
            for layer in out.past_key_values.layers:
                kv += [layer.keys[:, :, -s:], layer.values[:, :, -s:]]
            return (out.logits.float(), *kv)

    b, p, s = 2, 3, 4
    past = [torch.randn(b, heads, p, head_dim) for _ in range(2 * layers)]
    args = (torch.randint(0, cfg.vocab_size, (b, s)), torch.ones(b, p + s, dtype=torch.int64),
            torch.arange(p, p + s).repeat(b, 1), *past)
    past_names = [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    new_names = [f"new_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    axes = {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "T"},
            "position_ids": {0: "B", 1: "S"}, "logits": {0: "B", 1: "S"}}
    axes.update({n: {0: "B", 2: "P"} for n in past_names})
    axes.update({n: {0: "B", 2: "S"} for n in new_names})
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(Flat(model), args, str(out_dir / "model.onnx"), dynamo=False,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *new_names], dynamic_axes=axes, opset_version=17)
    ModelInfo(num_layers=layers, num_kv_heads=heads, head_dim=head_dim, vocab_size=cfg.vocab_size,
              max_position_embeddings=max_positions, precision="fp32", source="random tiny",
              architecture="Qwen2ForCausalLM").save(out_dir / "model.json")
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory) -> Path:
    return export_tiny_qwen(tmp_path_factory.mktemp("tiny_qwen"))
