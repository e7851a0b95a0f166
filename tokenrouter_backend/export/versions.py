"""Versions of the libraries that shape an export (part of every branch stamp and export.json).

A different onnx / onnxruntime / torch / transformers can produce different ONNX (exporter,
quantizer, GGUF de-quantization), so a cached branch built with other versions is rebuilt.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DEPENDENCIES = ("onnx", "onnxruntime", "torch", "transformers")
ALTERNATIVES = {"onnxruntime": ("onnxruntime-gpu",)}  # distributions providing the same module
NOT_INSTALLED = "not installed"


def package_version(name: str) -> str:
    """Installed version of one distribution or its alternative (``NOT_INSTALLED`` when absent)."""
    for dist in (name, *ALTERNATIVES.get(name, ())):
        try:
            return version(dist) if dist == name else f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return NOT_INSTALLED


def dependency_versions() -> dict[str, str]:
    """name -> installed version for every entry of DEPENDENCIES."""
    return {name: package_version(name) for name in DEPENDENCIES}
