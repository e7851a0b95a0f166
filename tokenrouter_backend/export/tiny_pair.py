"""The tiny heavy/light test pair: one small byte-level BPE tokenizer trained offline on
Python stdlib sources, two standard ``Qwen2ForCausalLM`` models (GQA) briefly trained on
the same text so that they agree on many tokens. Deterministic: fixed seeds, deterministic
torch algorithms and a fixed thread count while training, a single-threaded tokenizer
trainer — two builds on one machine are byte-identical. Seconds on two cores, skipped when
already built (stamp file).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Corpus: these stdlib modules (those present), concatenated in this order.
CORPUS_FILES = (
    "textwrap.py", "string.py", "heapq.py", "bisect.py", "queue.py", "functools.py",
    "dataclasses.py", "argparse.py", "shlex.py", "fnmatch.py", "glob.py", "shutil.py",
    "json/encoder.py", "json/decoder.py", "csv.py", "configparser.py", "difflib.py",
)
CORPUS_MAX_CHARS = 600_000  # caps tokenizer training text
TRAIN_TOKENS = 30_000  # models train on the first tokens only: small text, learnt fast
VOCAB_SIZE = 768  # BPE vocabulary incl. 256 byte symbols and the special tokens
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SEQ_LEN = 64  # training window
BATCH = 8
SEED = 1234
TRAIN_THREADS = 1  # torch intra-op threads while building: float sums in one fixed order
# bump when anything above, the model presets or the training recipe change what is built
# (the deterministic settings left the weights byte-identical to version 2's: measured)
BUILD_VERSION = 2


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape and training budget of one tiny model (Qwen2, GQA: kv_heads < heads)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    train_steps: int
    lr: float = 3e-3
    tie_embeddings: bool = False  # the GGUF-loaded demo pair is untied too


HEAVY = TinyModelSpec(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, train_steps=200, lr=5e-3)
LIGHT = TinyModelSpec(hidden=96, layers=2, heads=4, kv_heads=2, intermediate=256, train_steps=200, lr=8e-3)
DISTILL_CE_WEIGHT = 0.5  # light loss = KL(heavy || light) + this * next-token cross-entropy
STAMP = "tiny_pair.json"


def corpus_text() -> str:
    """The training text: the listed stdlib files that exist here, capped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in CORPUS_FILES if (root / name).is_file()]
    if not parts:
        raise RuntimeError(f"tiny pair: no corpus files found under {root}")
    return "\n".join(parts)[:CORPUS_MAX_CHARS]


def train_tokenizer(text: str):
    """A byte-level BPE (``tokenizers``) wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with _env("TOKENIZERS_PARALLELISM", "false"):  # one thread: merges in one fixed order
        tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def make_model(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int):
    """A randomly initialised Qwen2ForCausalLM (seeded by the caller)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=spec.tie_embeddings,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=pad_id,
        architectures=["Qwen2ForCausalLM"],
    )
    return Qwen2ForCausalLM(config)


def train(model, ids, spec: TinyModelSpec, teacher=None) -> float:
    """Deterministic AdamW steps; returns the last loss.

    Without a teacher: next-token cross-entropy. With one (the light model learning from
    the heavy one): KL to the teacher's distribution plus DISTILL_CE_WEIGHT * cross-entropy,
    so that the pair agrees on many tokens as a real heavy/light pair does.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own idiom

    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(spec.train_steps):
        starts = torch.randint(0, len(ids) - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = torch.stack([ids[s : s + SEQ_LEN] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch)
        loss = out.loss
        if teacher is not None:
            with torch.no_grad():
                target = F.log_softmax(teacher(input_ids=batch).logits, -1)
            kl = F.kl_div(F.log_softmax(out.logits, -1), target, log_target=True, reduction="none")
            loss = kl.sum(-1).mean() + DISTILL_CE_WEIGHT * out.loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


@contextlib.contextmanager
def _env(name: str, value: str):
    """Set one environment variable for the block, restoring its previous state."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def deterministic_torch(seed: int = SEED, threads: int = TRAIN_THREADS):
    """Seeded RNG, deterministic algorithms, a fixed thread count; all restored afterwards."""
    import torch

    state = torch.random.get_rng_state()
    algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    num_threads = torch.get_num_threads()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(num_threads)
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        torch.random.set_rng_state(state)


def _stamp_data() -> dict:
    return {"version": BUILD_VERSION, "train_tokens": TRAIN_TOKENS, "distill_ce": DISTILL_CE_WEIGHT,
            "heavy": asdict(HEAVY), "light": asdict(LIGHT), "vocab": VOCAB_SIZE, "seed": SEED,
            "files": list(CORPUS_FILES)}


def is_built(out_dir: Path) -> bool:
    """True when out_dir holds a pair built with the current settings."""
    stamp = Path(out_dir) / STAMP
    if not stamp.is_file():
        return False
    return json.loads(stamp.read_text()).get("settings") == _stamp_data()


def build_tiny_pair(out_dir: Path) -> tuple[Path, Path]:
    """Build (or reuse) the tiny pair under out_dir; returns (heavy_dir, light_dir)."""
    import torch

    out_dir = Path(out_dir)
    heavy_dir, light_dir = out_dir / "heavy", out_dir / "light"
    if is_built(out_dir):
        return heavy_dir, light_dir
    t0 = time.perf_counter()
    text = corpus_text()
    tokenizer = train_tokenizer(text)
    ids = torch.tensor(tokenizer(text)["input_ids"][:TRAIN_TOKENS], dtype=torch.long)
    report = {"settings": _stamp_data()}
    teacher = None
    for name, spec, path in (("heavy", HEAVY, heavy_dir), ("light", LIGHT, light_dir)):
        with deterministic_torch():
            model = make_model(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
            report[f"{name}_params"] = sum(p.numel() for p in model.parameters())
            report[f"{name}_loss"] = round(train(model, ids, spec, teacher), 4)
        teacher = model
        if path.exists():
            shutil.rmtree(path)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    report["build_s"] = round(time.perf_counter() - t0, 2)
    (out_dir / STAMP).write_text(json.dumps(report, indent=2) + "\n")
    return heavy_dir, light_dir
