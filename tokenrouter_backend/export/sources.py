"""Model sources: an HF model folder or a GGUF file -> transformers model and tokenizer.

GGUF files are loaded (dequantized to FP32) by transformers + ``gguf``. A GGUF-loaded model
refuses ``save_pretrained``; nothing here saves the model, only the tokenizer.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

GGUF_SUFFIX = ".gguf"
# Files of an HF folder that define the model (fingerprinted for up-to-date checks).
HF_MODEL_FILES = ("config.json", "*.safetensors", "*.bin", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Source:
    """Where a model comes from: ``directory`` (+ ``gguf_file`` for a GGUF source)."""

    path: Path
    directory: Path
    gguf_file: str | None = None

    @property
    def kind(self) -> str:
        return "gguf" if self.gguf_file else "hf"

    def load_kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_source(src: str | Path) -> Source:
    """Classify SRC: a .gguf file or an HF folder with config.json; else ValueError naming it."""
    path = Path(src).expanduser().resolve()
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return Source(path, path.parent, path.name)
    if path.is_dir() and (path / "config.json").is_file():
        return Source(path, path)
    raise ValueError(f"model source {src}: expected an HF model folder (with config.json) or a .gguf file")


def load_model(source: Source, dtype=None):
    """The transformers causal LM in eval mode, eager attention (exports cleanly)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        source.directory, dtype=dtype or torch.float32, attn_implementation="eager", **source.load_kwargs()
    )
    return model.eval()


def load_tokenizer(source: Source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.directory, **source.load_kwargs())


def _source_files(source: Source) -> list[Path]:
    if source.gguf_file:
        return [source.path]
    files = {f for pattern in HF_MODEL_FILES for f in source.directory.glob(pattern)}
    return sorted(files)


def fingerprint(source: Source) -> str:
    """Cheap identity of a source: names, sizes and mtimes of its model files (like make)."""
    h = hashlib.sha256()
    for f in _source_files(source):
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def tokenizer_differences(a, b) -> list[str]:
    """What differs between two tokenizers (vocabulary and special tokens); [] when equal."""
    diffs = []
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only_a = sorted(set(va) - set(vb))[:5]
        only_b = sorted(set(vb) - set(va))[:5]
        moved = sorted(t for t in set(va) & set(vb) if va[t] != vb[t])[:5]
        diffs.append(
            f"vocabulary differs (sizes {len(va)} vs {len(vb)}; only in heavy e.g. {only_a}, "
            f"only in light e.g. {only_b}, different ids e.g. {moved})"
        )
    for attr in ("eos_token", "bos_token", "pad_token", "unk_token"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            diffs.append(f"{attr} differs ({getattr(a, attr, None)!r} vs {getattr(b, attr, None)!r})")
    sa, sb = sorted(a.all_special_tokens), sorted(b.all_special_tokens)
    if sa != sb:
        diffs.append(f"special tokens differ ({sorted(set(sa) ^ set(sb))[:10]})")
    return diffs


def document_end_ids(source: Source, tokenizer) -> list[int]:
    """Token ids besides eos that end a document, so generation stops on them too.

    - the eos ids of the model's generation_config.json (HF folders; Qwen lists both
      <|im_end|> and <|endoftext|>);
    - a BOS the tokenizer never puts in front of a prompt: the model can only emit it at a
      document boundary (GGUF Qwen files carry <|endoftext|> as BOS, and no generation config).
    """
    ids: set[int] = set()
    gen = source.directory / "generation_config.json"
    if source.kind == "hf" and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    bos = tokenizer.bos_token_id
    if bos is not None and bos not in tokenizer("x")["input_ids"]:
        ids.add(bos)
    ids.discard(tokenizer.eos_token_id)
    return sorted(int(i) for i in ids)
