"""A branch's stamp: what its export did (``BranchBuild``) and whether the work directory's
copy can be reused.

Each branch directory in the work directory holds ``stamp.json``: a key (hash of the
source's files, the exporter version, the dependency versions and the options that shape
that branch) and the ``BranchBuild``. A branch whose stamp key matches is reused as it is,
so a second export of the same pair does no work.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import quantize, versions
from .onnx_export import onnx_files
from .options import ExportOptions
from .sources import Source, fingerprint

EXPORTER_VERSION = 4  # bump when the ONNX produced for the same inputs changes (4: logits_positions input)
HF_DIR = "hf"  # the HF folder inside a torch-runtime branch directory
STAMP = "stamp.json"


@dataclass
class BranchBuild:
    """What the branch export did (kept in its stamp and in export.json)."""

    role: str
    directory: str
    source: str
    precision: str
    onnx_bytes: int = 0
    load_s: float = 0.0
    export_s: float = 0.0
    quantize_s: float = 0.0
    validation: dict | None = None
    quant_candidates: dict = field(default_factory=dict)
    quant_reason: str = ""  # light: why this quantization (default, requested, or auto's timings)
    notes: list = field(default_factory=list)
    skipped: bool = False


def stamp_key(source: Source, role: str, options: ExportOptions) -> str:
    """The key of what shapes a ``role`` branch built from ``source`` with ``options``."""
    shaping = {"v": EXPORTER_VERSION, "role": role, "src": fingerprint(source), "device": options.device,
               "validate": not options.skip_validation, "deps": versions.dependency_versions()}
    if role == "light":
        shaping["quant"] = [options.light_quant, quantize.AUTO_AGREEMENT_SLACK, quantize.NBITS_BLOCK_SIZE,
                            quantize.NBITS_ACCURACY_LEVEL]
        if options.light_quant in quantize.MIN_ROWS or options.light_quant == quantize.AUTO:
            shaping["quant"].append(sorted(quantize.ACCURACY_LEVEL.items()))  # modes added later: own stamps
    if options.runtime != "onnx":  # onnx stamps stay as they were before runtimes existed
        shaping["runtime"] = options.runtime
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def reused_build(branch_dir: Path, key: str) -> BranchBuild | None:
    """The stamped build of ``branch_dir`` (marked skipped) when its files are there and its
    key is ``key``; else None (the branch is built again)."""
    stamp = branch_dir / STAMP
    if not stamp.is_file() or not (onnx_files(branch_dir) or (branch_dir / HF_DIR / "config.json").is_file()):
        return None
    data = json.loads(stamp.read_text())
    if data.get("key") != key:
        return None
    return BranchBuild(**{**data["build"], "skipped": True})


def save_stamp(branch_dir: Path, key: str, build: BranchBuild) -> None:
    """Write ``branch_dir``'s stamp: its key and what its export did."""
    (branch_dir / STAMP).write_text(json.dumps({"key": key, "build": asdict(build)}, indent=2) + "\n")
