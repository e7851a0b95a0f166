"""One exported causal LM run by ONNX Runtime: model.onnx + model.json (see docs/architecture.md).

``OnnxCausalLM.forward`` is a single forward pass over a padded batch; it knows nothing of
sessions (``kv_store``) or batching policy (``branch_engine``). Graphs exported since
exporter version 4 take ``logits_positions`` and compute the LM head only there; an older
graph computes every position and the requested rows are picked afterwards (same result,
unbounded memory: re-export it).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODEL_FILE = "model.onnx"
INFO_FILE = "model.json"
LOGITS_POSITIONS = "logits_positions"  # graph input: which new positions get logits [B, K]


def all_positions(batch: int, new: int) -> np.ndarray:
    """logits_positions asking for every new position: [B, S]."""
    return np.broadcast_to(np.arange(new, dtype=np.int64), (batch, new))


@dataclass(frozen=True)
class RowPadding:
    """A forward grown to ``min_rows`` rows at every product, and how to cut its outputs back.

    Some kernels take another path for a single-row product than for two or more rows, whose
    rows are computed independently of each other (MatMulNBits with int8 compute in ONNX
    Runtime). One session feeding one token would then get other logits alone than inside a
    batch. Growing the forward keeps every session on the batch path: a batch of fewer rows
    than ``min_rows`` is repeated along the batch axis (its past too; the copies' outputs are
    dropped), and a forward asking logits at fewer rows repeats its last wanted position so
    the LM head has enough rows. (A dummy token after the real one would not do: measured, a
    two-token forward of one session gives its first token other logits than a batch does.)"""

    copies: int  # how many times the batch is repeated (1 = not)
    logits_positions: np.ndarray
    batch: int  # the caller's B: rows beyond it are copies
    wanted: int  # the caller's K: logits beyond it are the padding's


def pad_rows(batch: int, new: int, logits_positions: np.ndarray | None, min_rows: int) -> RowPadding | None:
    """How to pad a forward of ``batch`` x ``new`` tokens; None when nothing is short of ``min_rows``."""
    wanted = all_positions(batch, new) if logits_positions is None else np.asarray(logits_positions)
    k = wanted.shape[1]
    if batch * new >= min_rows and batch * k >= min_rows:
        return None
    copies = max(1, -(-min_rows // (batch * new)))
    per_row = -(-min_rows // (batch * copies))
    positions = np.concatenate([wanted, np.repeat(wanted[:, -1:], max(0, per_row - k), axis=1)], axis=1)
    return RowPadding(copies, positions, batch, k)


def pick_positions(logits: np.ndarray, positions: np.ndarray | None) -> np.ndarray:
    """Rows ``positions`` [B, K] of full logits [B, S, V] (a model without the graph input)."""
    if positions is None:
        return logits
    return np.take_along_axis(logits, np.asarray(positions)[:, :, None], axis=1)


@dataclass(frozen=True)
class ModelInfo:
    """Shape facts of an exported model (written by the exporter as model.json)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str = "float32"
    max_position_embeddings: int = 2048
    precision: str = "fp32"
    source: str = ""
    architecture: str = ""
    min_rows: int = 1  # rows (batch x tokens) every product needs to be batch-invariant (see pad_rows)

    @classmethod
    def load(cls, path: Path) -> "ModelInfo":
        data = json.loads(Path(path).read_text())
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @property
    def np_kv_dtype(self) -> np.dtype:
        return np.dtype(self.kv_dtype)

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies (all layers, key and value)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.np_kv_dtype.itemsize


def providers_for(device: str) -> list:
    """ONNX Runtime execution providers for a device name: cpu | cuda | tensorrt."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "tensorrt":
        return ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    raise ValueError(f"device must be one of cpu, cuda, tensorrt; got {device!r}")


@dataclass(frozen=True)
class OrtThreading:
    """How a session's intra-op threads behave when another process wants the same cores.

    ``spinning``: idle workers busy-wait for the next parallel section (ONNX Runtime's
    default; fastest when the session has the cores to itself, wasteful when another
    branch's forward runs at the same time). ``dynamic_block_base``: > 0 lets threads take
    work in shrinking blocks instead of one equal share each, so a thread that lost its
    core to another process does not hold the whole operator up (0 = ORT's static split).
    ``spin_between_runs`` false: workers stop spinning when a forward ends, so the cores are
    free at once for whoever runs next (another branch's forward).
    """

    spinning: bool = True
    dynamic_block_base: int = 0
    spin_between_runs: bool = True

    def session_entries(self) -> dict[str, str]:
        entries = {"session.intra_op.allow_spinning": "1" if self.spinning else "0"}
        if not self.spin_between_runs:
            entries["session.force_spinning_stop"] = "1"
        if self.dynamic_block_base > 0:
            entries["session.dynamic_block_base"] = str(self.dynamic_block_base)
        return entries


class OnnxCausalLM:
    """An ONNX Runtime session over an exported model directory."""

    def __init__(self, model_dir: str | os.PathLike, device: str = "cpu", intra_op_threads: int = 0,
                 threading: OrtThreading | None = None):
        import onnxruntime as ort

        model_dir = Path(model_dir)
        self.info = ModelInfo.load(model_dir / INFO_FILE)
        self.device = device
        opts = ort.SessionOptions()
        if intra_op_threads > 0:
            opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        for key, value in (threading or OrtThreading()).session_entries().items():
            opts.add_session_config_entry(key, value)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(model_dir / MODEL_FILE), sess_options=opts, providers=providers_for(device)
        )
        self._past_names = [
            (f"past_key_{i}", f"past_value_{i}") for i in range(self.info.num_layers)
        ]
        self._output_names = ["logits"] + [
            name for i in range(self.info.num_layers) for name in (f"new_key_{i}", f"new_value_{i}")
        ]
        self.scores_in_graph = any(i.name == LOGITS_POSITIONS for i in self.session.get_inputs())

    def empty_past(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Past of length 0 for a batch (first call of new sessions)."""
        shape = (batch, self.info.num_kv_heads, 0, self.info.head_dim)
        z = np.zeros(shape, dtype=self.info.np_kv_dtype)
        return [(z, z) for _ in range(self.info.num_layers)]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
        logits_positions: np.ndarray | None = None,
        pad: bool = True,
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """One forward pass.

        input_ids, position_ids: [B, S]; attention_mask: [B, P + S]; past: per layer
        (key, value) [B, kv_heads, P, head_dim]; logits_positions: [B, K] indices into the
        S new positions (None = all). Returns logits [B, K, V] float32 and per layer the
        new tokens' (key, value) [B, kv_heads, S, head_dim]. A model with ``min_rows`` > 1
        runs a shorter forward padded (``pad_rows``); the outputs are the caller's shapes.
        ``pad=False`` runs it as given: the single-row kernel path, for a caller that runs every
        one-session, one-token forward that way (``EngineConfig.lone_decode_steps``).
        """
        padding = pad_rows(*input_ids.shape, logits_positions, self.info.min_rows) \
            if pad and self.info.min_rows > 1 else None
        if padding is None:
            return self._forward(input_ids, attention_mask, position_ids, past, logits_positions)
        n = padding.copies
        logits, new_kv = self._forward(
            np.tile(input_ids, (n, 1)), np.tile(attention_mask, (n, 1)), np.tile(position_ids, (n, 1)),
            [(np.concatenate([k] * n), np.concatenate([v] * n)) if n > 1 else (k, v) for k, v in past],
            np.tile(padding.logits_positions, (n, 1)))
        b = padding.batch
        return logits[:b, :padding.wanted], [(k[:b], v[:b]) for k, v in new_kv]

    def _forward(self, input_ids, attention_mask, position_ids, past, logits_positions):
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
            "position_ids": np.ascontiguousarray(position_ids, dtype=np.int64),
        }
        if self.scores_in_graph:
            wanted = all_positions(*input_ids.shape) if logits_positions is None else logits_positions
            feeds[LOGITS_POSITIONS] = np.ascontiguousarray(wanted, dtype=np.int64)
        for (kname, vname), (k, v) in zip(self._past_names, past):
            feeds[kname] = k
            feeds[vname] = v
        outs = self.session.run(self._output_names, feeds)
        new_kv = [(outs[1 + 2 * i], outs[2 + 2 * i]) for i in range(self.info.num_layers)]
        logits = outs[0] if self.scores_in_graph else pick_positions(outs[0], logits_positions)
        return logits, new_kv
