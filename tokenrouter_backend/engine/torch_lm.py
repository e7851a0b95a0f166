"""One causal LM run by PyTorch (transformers): the ``torch`` runtime of a branch.

``TorchCausalLM`` has the interface of ``onnx_lm.OnnxCausalLM`` (``info``, ``empty_past``,
``forward``) so ``BranchEngine`` drives either. Its KV tensors stay on the model's device:
``kv_arrays`` makes the engine's ``KVStore`` allocate its session buffers there, ``forward``
takes the past as device tensors and returns the new tokens' KV as device tensors. Only
the logits come back to the host (float32 numpy), because the engine scores them there
and the branch tensors Triton sends back are host tensors.

Weights come from an HF folder (config.json + safetensors) that ``tokenrouter export
--runtime torch`` writes as ``<branch>/1/hf/``. The light branch runs in FP16 on CUDA here:
torch has no simple INT8 GPU matmul path; INT8 light on GPU is the ONNX Runtime path
(docs/deployment.md).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tokenrouter_backend.engine.kv_session import KVArrays
from tokenrouter_backend.engine.onnx_lm import ModelInfo
from tokenrouter_backend.engine.step_timing import step_ms  # noqa: F401 - re-exported (GPU check, tests)

DEVICES = ("cpu", "cuda")
DTYPES = ("float16", "float32", "bfloat16")
AUTO_DTYPE = {"cuda": "float16", "cpu": "float32"}  # dtype "auto": FP16 on GPU, FP32 on CPU
ATTENTION = "sdpa"  # transformers attention implementation (padded masks handled by it)
HF_DIR = "hf"  # the HF folder inside a branch version directory


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` -> float16 on cuda, float32 on cpu; else the name itself (validated)."""
    if device not in DEVICES:
        raise ValueError(f"torch runtime device must be one of {', '.join(DEVICES)}; got {device!r}")
    name = AUTO_DTYPE[device] if dtype == "auto" else dtype
    if name not in DTYPES:
        raise ValueError(f"torch runtime dtype must be auto or one of {', '.join(DTYPES)}; got {dtype!r}")
    return name


def info_from_config(config, dtype: str, source: str = "") -> ModelInfo:
    """The ``ModelInfo`` facts of an HF config (KV in ``dtype``)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    arch = (getattr(config, "architectures", None) or [""])[0]
    precision = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}[dtype]
    return ModelInfo(num_layers=cfg.num_hidden_layers, num_kv_heads=kv_heads, head_dim=head_dim,
                     vocab_size=cfg.vocab_size, kv_dtype=dtype,
                     max_position_embeddings=getattr(cfg, "max_position_embeddings", 2048),
                     precision=precision, source=source, architecture=arch)


def hf_folder(model_dir: str | os.PathLike) -> Path:
    """The HF folder: ``model_dir`` itself when it holds config.json, else ``model_dir/hf``."""
    model_dir = Path(model_dir)
    for candidate in (model_dir, model_dir / HF_DIR):
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(f"{model_dir}: no config.json here or in {HF_DIR}/ (export with --runtime torch)")


class TorchCausalLM:
    """A transformers causal LM on one device with a flat-KV ``forward`` like OnnxCausalLM."""

    def __init__(self, model_dir: str | os.PathLike | None = None, device: str = "cuda",
                 dtype: str = "auto", *, model=None):
        """Load ``model_dir`` (HF folder, or a branch dir holding ``hf/``), or wrap ``model``."""
        import torch

        self.device = device
        self.dtype_name = resolve_dtype(dtype, device)
        self.torch_dtype = getattr(torch, self.dtype_name)
        if model is None:
            from transformers import AutoModelForCausalLM

            folder = hf_folder(model_dir)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=self.torch_dtype,
                                                         attn_implementation=ATTENTION)
            source = str(folder)
        else:
            source = getattr(model.config, "_name_or_path", "") or "in-memory"
        self.model = model.to(device=device, dtype=self.torch_dtype).eval()
        self.info = info_from_config(self.model.config, self.dtype_name, source)
        self.kv_arrays = KVArrays(self._empty, views_ok=True, name=f"torch:{device}")

    def _empty(self, shape: tuple):
        import torch

        return torch.empty(shape, dtype=self.torch_dtype, device=self.device)

    def empty_past(self, batch: int) -> list:
        """Past of length 0 for a batch (device tensors)."""
        z = self._empty((batch, self.info.num_kv_heads, 0, self.info.head_dim))
        return [(z, z) for _ in range(self.info.num_layers)]

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
                past: list, logits_positions: np.ndarray | None = None) -> tuple[np.ndarray, list]:
        """One forward pass; same shapes and padding rules as ``OnnxCausalLM.forward``.

        input_ids, attention_mask, position_ids: host int arrays (small); past: per layer
        (key, value) device tensors [B, kv_heads, P, head_dim]; logits_positions [B, K]
        (None = all new positions). Returns logits [B, K, V] float32 numpy (the LM head runs
        on those positions only) and per layer the new tokens' (key, value) as device tensors.
        """
        import torch
        from transformers import DynamicCache

        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            if past and past[0][0].shape[2]:  # a 0-length past is an empty cache
                for layer, (k, v) in enumerate(past):
                    cache.update(k, v, layer)
            out = self.model.get_decoder()(
                input_ids=self._ids(input_ids), attention_mask=self._ids(attention_mask),
                position_ids=self._ids(position_ids), past_key_values=cache, use_cache=True)
            new = input_ids.shape[1]
            new_kv = [(layer.keys[:, :, -new:], layer.values[:, :, -new:])
                      for layer in out.past_key_values.layers]
            hidden = out.last_hidden_state
            if logits_positions is not None:
                index = self._ids(logits_positions).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
                hidden = torch.gather(hidden, 1, index)
            logits = self.model.get_output_embeddings()(hidden)
            logits = logits.float().cpu().numpy()  # the one device->host copy of a step
        return logits, new_kv

    def _ids(self, array: np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(self.device, non_blocking=True)

    def synchronize(self) -> None:
        """Wait for queued device work (timings); a no-op on CPU."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
