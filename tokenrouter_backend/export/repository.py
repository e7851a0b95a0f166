"""Fill a Triton model repository from the template tree (``model_repository/``).

The template is copied to OUT, every ``${name}`` in each config.pbtxt is replaced from a
dict (a placeholder left without a value is an error naming it and the file), the tokenizer
goes to ``preprocessing/1/tokenizer/``, ``router/1/tokenizer/`` (stop strings) and
``postprocessing/1/tokenizer/``, each branch's
ONNX files + model.json to ``heavy/1/`` and ``light/1/``, and ``export.json`` records what
was exported.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from tokenrouter_backend.core.protocol.branch_auth import write_key_files
from tokenrouter_backend.engine.onnx_lm import INFO_FILE

from .onnx_export import DATA_FILE, onnx_files

CONFIG_FILE = "config.pbtxt"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
TOKENIZER_DIRS = ("preprocessing/1/tokenizer", "router/1/tokenizer", "postprocessing/1/tokenizer")
BRANCH_DIRS = {"heavy": "heavy/1", "light": "light/1"}
HF_DIR = "hf"  # torch runtime: HF folder inside a branch directory
EXPORT_REPORT = "export.json"
REQUIRED_PLACEHOLDERS = (
    "heavy_device", "light_device", "heavy_threads", "light_threads", "max_context",
    "end_id", "stop_token_ids", "vocab_size", "heavy_precision", "light_precision",
    "heavy_kv_budget_mb", "light_kv_budget_mb", "max_live_tokens",
)


class TemplateError(ValueError):
    """A template placeholder has no value (message names it and the file)."""


def fill_text(text: str, values: dict, where: str) -> str:
    """Replace ``${name}`` from values; raise TemplateError naming unknown ones and ``where``."""
    missing = sorted({m for m in PLACEHOLDER.findall(text) if m not in values})
    if missing:
        raise TemplateError(f"{where}: no value for placeholder(s) {', '.join('${' + m + '}' for m in missing)}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def copy_template(template: Path, out: Path) -> None:
    """Copy the template tree over OUT (existing files replaced, generated weights kept)."""
    template = Path(template)
    if not template.is_dir():
        raise FileNotFoundError(f"model repository template {template} does not exist")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(template, out, dirs_exist_ok=True, ignore=ignore)


def fill_configs(out: Path, values: dict) -> list[Path]:
    """Fill every config.pbtxt under OUT in place; returns the files filled."""
    filled = []
    for cfg in sorted(Path(out).rglob(CONFIG_FILE)):
        cfg.write_text(fill_text(cfg.read_text(), values, str(cfg)))
        filled.append(cfg)
    return filled


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard link when possible (multi-GB weights), else copy.

    ONNX Runtime loads hard-linked external data, but ``onnx.load`` (its checker) refuses
    a data file with several links ("potential hardlink attack"): tools that re-read a
    repository's model with the ``onnx`` package must copy it first.
    """
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def place_branch(branch_dir: Path, out: Path, role: str) -> None:
    dst = Path(out) / BRANCH_DIRS[role]
    dst.mkdir(parents=True, exist_ok=True)
    files = onnx_files(branch_dir) + [Path(branch_dir) / INFO_FILE]
    if not (Path(branch_dir) / DATA_FILE).exists():
        (dst / DATA_FILE).unlink(missing_ok=True)  # left from an earlier, larger export
    for f in files:
        link_or_copy(f, dst / f.name)
    hf = Path(branch_dir) / HF_DIR
    if hf.is_dir():  # torch runtime: the HF folder (its files hard-linked like the ONNX ones)
        (dst / HF_DIR).mkdir(exist_ok=True)
        for f in hf.iterdir():
            link_or_copy(f, dst / HF_DIR / f.name)


def place_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for rel in TOKENIZER_DIRS:
        dst = Path(out) / rel
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(tokenizer_dir, dst)


def fill_repository(template: Path, out: Path, values: dict, branches: dict[str, Path],
                    tokenizer_dir: Path, report: dict) -> Path:
    """Build the whole repository at OUT; returns OUT/export.json."""
    missing = [k for k in REQUIRED_PLACEHOLDERS if k not in values]
    if missing:
        raise TemplateError(f"fill_repository: values lack {missing}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_template(template, out)
    fill_configs(out, values)
    place_tokenizer(tokenizer_dir, out)
    for role, branch_dir in branches.items():
        place_branch(branch_dir, out, role)
    write_key_files(out)  # a fresh per-deployment branch key (core/protocol/branch_auth.py)
    return write_report(out / EXPORT_REPORT, report)


def write_report(path: Path, report: dict) -> Path:
    """The export report as JSON (OUT/export.json, or the work dir's with --onnx-only)."""
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path
