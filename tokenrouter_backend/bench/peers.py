"""In-process peers on the same heavy/light pair, through transformers ``generate``:

* ``hf_heavy``: heavy model alone, greedy;
* ``hf_assisted``: assisted generation, ``assistant_model`` = light, transformers' default
  assistant schedule (whatever the light model's generation config says; recorded);
* ``hf_prompt_lookup``: prompt-lookup decoding (``prompt_lookup_num_tokens``) on the heavy.

Sources are HF folders or GGUF files (a ``.gguf`` path, or a folder holding one ``.gguf`` and
no ``config.json``), as the exporter accepts. Torch runs with ``TORCH_THREADS`` threads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

TORCH_THREADS = 2              # the machine's cores; the Triton arms use the same budget
PROMPT_LOOKUP_TOKENS = 10      # transformers' documented example value
HF_HEAVY = "hf_heavy"
HF_ASSISTED = "hf_assisted"
HF_PROMPT_LOOKUP = "hf_prompt_lookup"
PEER_ARMS = (HF_HEAVY, HF_ASSISTED, HF_PROMPT_LOOKUP)


@dataclass
class PeerResult:
    text: str
    output_ids: list[int]
    ttft_s: float
    latency_s: float
    extra: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.output_ids)


def gguf_location(src: Path) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) for a source path."""
    if src.is_file() and src.suffix == ".gguf":
        return src.parent, src.name
    if src.is_dir() and not (src / "config.json").exists():
        ggufs = sorted(src.glob("*.gguf"))
        if len(ggufs) == 1:
            return src, ggufs[0].name
    return src, None


def load_model(src: str | Path):
    """(model, tokenizer) from an HF folder or GGUF, FP32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = gguf_location(Path(src).expanduser())
    kwargs = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    return model.eval(), tok


class _TimingStreamer:
    """Records when the first generated token arrives (the first ``put`` is the prompt)."""

    def __init__(self, start: float):
        self.start, self.calls, self.first_s = start, 0, 0.0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and not self.first_s:
            self.first_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


class Peers:
    """The heavy and (optionally) light transformers models, loaded once."""

    def __init__(self, heavy_src: str | Path, light_src: str | Path | None):
        import torch

        torch.set_num_threads(TORCH_THREADS)
        self.heavy, self.tokenizer = load_model(heavy_src)
        self.light = load_model(light_src)[0] if light_src else None

    def arms(self) -> tuple[str, ...]:
        return PEER_ARMS if self.light is not None else (HF_HEAVY, HF_PROMPT_LOOKUP)

    def assistant_schedule(self) -> dict:
        if self.light is None:
            return {}
        cfg = self.light.generation_config
        return {k: getattr(cfg, k, None) for k in
                ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}

    def generate(self, arm: str, prompt: str, max_tokens: int) -> PeerResult:
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        kwargs = {"max_new_tokens": max_tokens, "do_sample": False,
                  "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        if arm == HF_ASSISTED:
            kwargs["assistant_model"] = self.light
            if self.light is None:
                raise ValueError("hf_assisted needs a light model")
        elif arm == HF_PROMPT_LOOKUP:
            kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
        elif arm != HF_HEAVY:
            raise ValueError(f"unknown peer arm {arm!r}")
        start = time.perf_counter()
        streamer = _TimingStreamer(start)
        with torch.no_grad():
            out = self.heavy.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer, **kwargs)
        latency = time.perf_counter() - start
        new = out[0, ids.shape[1]:].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return PeerResult(text, new, streamer.first_s or latency, latency)
