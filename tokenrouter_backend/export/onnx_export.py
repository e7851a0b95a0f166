"""transformers causal LM -> ONNX with flat KV inputs/outputs (docs/architecture.md contract).

The wrapper rebuilds a ``DynamicCache`` from ``past_key_{i}``/``past_value_{i}``, runs the
model's decoder with explicit ``attention_mask`` (past left-padded, new tokens right-padded)
and ``position_ids``, and applies the LM head only to the new positions named by
``logits_positions`` [B, K] (indices into the new tokens): a prefill asks for its last
position, a verify for its drafts, so no forward holds ``[B, S, vocab]`` logits. It returns
float32 logits [B, K, V] plus the KV of the new tokens only. Exported
with the TorchScript exporter (``dynamo=False``); weights over 2 GB go to one external
data file ``model.onnx.data``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from tokenrouter_backend.engine.onnx_lm import INFO_FILE, MODEL_FILE, ModelInfo

OPSET = 17
DATA_FILE = MODEL_FILE + ".data"
EXTERNAL_DATA_BYTES = 1_800_000_000  # above this, weights go to DATA_FILE (protobuf limit 2 GB)
INLINE_TENSOR_BYTES = 1024  # smaller initializers stay inside model.onnx
# Trace shapes: a batch of 2 with a left-padded past and right-padded new tokens, so no
# shape is 0 or 1 (the tracer would fold it into a constant) and no mask is all ones.
TRACE_BATCH, TRACE_PAST, TRACE_NEW = 2, 3, 2


def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def kv_shape_facts(model) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a decoder-only model's KV cache."""
    cfg = _text_config(model)
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


class FlatKVWrapper(torch.nn.Module):
    """forward(input_ids, attention_mask, position_ids, logits_positions, *flat_past)
    -> (logits [B, K, V], *flat_new_kv)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.num_layers = kv_shape_facts(model)[0]

    def forward(self, input_ids, attention_mask, position_ids, logits_positions, *flat_past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.num_layers):
            cache.update(flat_past[2 * i], flat_past[2 * i + 1], i)
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state  # [B, S, H]
        index = logits_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        logits = self.head(torch.gather(hidden, 1, index))  # [B, K, V]: only the positions asked for
        new_len = input_ids.shape[1]
        new_kv = []
        for layer in out.past_key_values.layers:
            new_kv += [layer.keys[:, :, -new_len:, :], layer.values[:, :, -new_len:, :]]
        return (logits.float(), *new_kv)


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask", "position_ids", "logits_positions"]
    outputs = ["logits"]
    for i in range(num_layers):
        inputs += [f"past_key_{i}", f"past_value_{i}"]
        outputs += [f"new_key_{i}", f"new_value_{i}"]
    return inputs, outputs


def dynamic_axes(num_layers: int) -> dict:
    axes = {
        "input_ids": {0: "batch", 1: "new"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "new"},
        "logits_positions": {0: "batch", 1: "scored"},
        "logits": {0: "batch", 1: "scored"},
    }
    for i in range(num_layers):
        for name in (f"past_key_{i}", f"past_value_{i}"):
            axes[name] = {0: "batch", 2: "past"}
        for name in (f"new_key_{i}", f"new_value_{i}"):
            axes[name] = {0: "batch", 2: "new"}
    return axes


def trace_inputs(model, kv_dtype: torch.dtype) -> tuple:
    """Example inputs: row 0 has a full past, row 1 a past left-padded by one token."""
    layers, kv_heads, head_dim = kv_shape_facts(model)
    b, p, s = TRACE_BATCH, TRACE_PAST, TRACE_NEW
    ids = torch.tensor([[5, 6], [7, 0]], dtype=torch.long)[:b, :s]
    mask = torch.ones(b, p + s, dtype=torch.long)
    mask[1, 0] = 0  # left pad in the past of row 1
    mask[1, -1] = 0  # right pad among the new tokens of row 1
    pos = torch.tensor([[p, p + 1], [p - 1, p]], dtype=torch.long)
    scored = torch.tensor([[0, 1], [0, 0]], dtype=torch.long)  # row 1: its one real token, twice
    past = []
    gen = torch.Generator().manual_seed(0)
    for _ in range(layers):
        past += [torch.randn(b, kv_heads, p, head_dim, generator=gen).to(kv_dtype) for _ in range(2)]
    return (ids, mask, pos, scored, *past)


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def export_model(model, out_dir: Path, *, half: bool = False) -> Path:
    """Export ``model`` to out_dir/model.onnx (+ model.onnx.data when large); returns the path.

    half: convert the weights and KV to float16 before tracing (logits stay float32).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if half:
        model = model.half()
    kv_dtype = torch.float16 if half else torch.float32
    wrapper = FlatKVWrapper(model).eval()
    inputs, outputs = io_names(wrapper.num_layers)
    large = _param_bytes(model) > EXTERNAL_DATA_BYTES
    target = out_dir / MODEL_FILE
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".trace-") as tmp:
        raw = Path(tmp) / MODEL_FILE
        with torch.no_grad():
            torch.onnx.export(
                wrapper, trace_inputs(model, kv_dtype), str(raw), input_names=inputs,
                output_names=outputs, dynamic_axes=dynamic_axes(wrapper.num_layers),
                opset_version=OPSET, dynamo=False, do_constant_folding=True,
            )
        for old in (target, out_dir / DATA_FILE):
            old.unlink(missing_ok=True)
        if large or any(f.name != MODEL_FILE for f in Path(tmp).iterdir()):
            consolidate_external_data(raw, target)
        else:
            shutil.move(str(raw), target)
    return target


def consolidate_external_data(src: Path, dst: Path) -> None:
    """Rewrite a model whose weights lie in many files (or inline) into dst + one dst.data.

    Streams tensor by tensor (page-aligned, so ORT can mmap); small tensors stay inline.
    """
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(src), load_external_data=False)
    data_path = dst.parent / (dst.name + ".data")
    offset = 0
    with open(data_path, "wb") as out:
        for tensor in _all_tensors(model):
            if uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                with open(src.parent / info.location, "rb") as f:
                    f.seek(info.offset or 0)
                    blob = f.read(info.length) if info.length else f.read()
            elif len(tensor.raw_data) > INLINE_TENSOR_BYTES:
                blob = tensor.raw_data
            else:
                continue
            pad = (-offset) % 4096
            out.write(b"\0" * pad)
            offset += pad
            out.write(blob)
            _point_to(tensor, data_path.name, offset, len(blob))
            offset += len(blob)
    onnx.save_model(model, str(dst))


def _point_to(tensor, location: str, offset: int, length: int) -> None:
    """Make ``tensor`` refer to (location, offset, length) instead of holding its bytes."""
    import onnx

    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _all_tensors(model):
    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == attr.TENSOR:
                yield attr.t


def model_info(model, *, precision: str, kv_dtype: str, source: str) -> ModelInfo:
    """The model.json facts for an exported model."""
    layers, kv_heads, head_dim = kv_shape_facts(model)
    cfg = _text_config(model)
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    return ModelInfo(
        num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=cfg.vocab_size,
        kv_dtype=kv_dtype, max_position_embeddings=getattr(cfg, "max_position_embeddings", 2048),
        precision=precision, source=source, architecture=arch,
    )


def write_info(info: ModelInfo, out_dir: Path) -> None:
    info.save(Path(out_dir) / INFO_FILE)


def onnx_files(out_dir: Path) -> list[Path]:
    """model.onnx and its data file if any."""
    return [p for p in (Path(out_dir) / MODEL_FILE, Path(out_dir) / DATA_FILE) if p.exists()]


def onnx_bytes(out_dir: Path) -> int:
    return sum(os.path.getsize(p) for p in onnx_files(out_dir))
