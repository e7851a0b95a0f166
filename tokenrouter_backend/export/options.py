"""What one ``tokenrouter export`` is asked for: ``ExportOptions``, their checks and choices.

Defaults are the CLI's (``pipeline.add_arguments``); an option that cannot work with the
others (``--train-router`` with ``--router`` or without a repository, a router threshold
without a router) is refused here, before any model is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import quantize, router_build

DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "model_repository"
DEVICES = ("cpu", "cuda")
RUNTIMES = ("onnx", "torch")  # onnx (default): ONNX Runtime branches; torch: HF folders for torch_lm
LIGHT_QUANT_CHOICES = (quantize.AUTO, *quantize.QUANT_MODES, "none")


@dataclass(frozen=True)
class ExportOptions:
    """Options of one export; defaults are the CLI defaults."""

    device: str = "cpu"  # cpu: heavy FP32; cuda: heavy FP16 (KV float16)
    runtime: str = "onnx"  # onnx | torch (see the pipeline module's docstring)
    light_quant: str = quantize.DEFAULT_MODE  # see export.quantize; auto: timed pick; "none": light FP32
    threads: int = 0  # ONNX Runtime intra-op threads per branch (0 = ORT default)
    skip_validation: bool = False
    max_context: int = 0  # 0 = min of the two models' max_position_embeddings
    template: Path | None = DEFAULT_TEMPLATE  # None: build the ONNX branches only
    work_dir: Path | None = None  # None: default_work_dir(OUT)
    router: Path | None = None  # a learned router (train-router) shipped as router/1/router.json
    train_router: bool = False  # build a default router for this pair from generated verify logs
    router_tokens: int = router_build.RouterBuildOptions.max_tokens  # new tokens per training prompt
    router_threshold: float | None = None  # the repository's P(disagree) bar; None: the router file's own

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}; got {self.device!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"--runtime must be one of {RUNTIMES}; got {self.runtime!r}")
        if self.light_quant not in LIGHT_QUANT_CHOICES:
            raise ValueError(f"--light-quant must be one of {LIGHT_QUANT_CHOICES}; got {self.light_quant!r}")
        if self.train_router:
            router_build.RouterBuildOptions(self.router_tokens)  # range check
            if self.router is not None:
                raise ValueError("--train-router builds the router: do not also give --router")
            if self.runtime != "onnx" or self.template is None:
                raise ValueError("--train-router needs --runtime onnx and a repository (not --onnx-only)")
        if self.router_threshold is not None:
            if not 0.0 <= self.router_threshold <= 1.0:
                raise ValueError(f"--router-threshold must be in [0, 1]; got {self.router_threshold}")
            if self.router is None and not self.train_router:
                raise ValueError("--router-threshold needs a learned router (--router or --train-router)")
