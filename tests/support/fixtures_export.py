"""Session fixtures for the exporter tests: the tiny pair and its exported repository.

Registered for every test module by ``pytest_plugins`` in tests/conftest.py;
the pair is built once per session (or reused from TOKENROUTER_TINY_DIR when set).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenrouter_backend.export.pipeline import ExportOptions, export_pair
from tokenrouter_backend.export.tiny_pair import build_tiny_pair

TINY_DIR_ENV = "TOKENROUTER_TINY_DIR"  # reuse a pair built earlier (stamp-checked)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(heavy_dir, light_dir) of the tiny pair."""
    root = os.environ.get(TINY_DIR_ENV)
    # a fixed folder: modules importing this fixture get their own instance, the stamp dedups
    out = Path(root) if root else tmp_path_factory.getbasetemp() / "tiny_pair"
    return build_tiny_pair(out)


@pytest.fixture(scope="session")
def tiny_template(tmp_path_factory) -> Path:
    """A minimal repository template using every placeholder the exporter provides."""
    root = tmp_path_factory.getbasetemp() / "template"
    if root.exists():
        return root
    for model, keys in {
        "heavy": ("heavy_device", "heavy_threads", "heavy_precision", "max_context"),
        "light": ("light_device", "light_threads", "light_precision", "max_context"),
        "preprocessing": ("end_id", "stop_token_ids", "vocab_size"),
    }.items():
        (root / model / "1").mkdir(parents=True)
        params = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "${{{k}}}" }} }}' for k in keys)
        (root / model / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n{params}\n')
        (root / model / "1" / "model.py").write_text("# template model\n")
    return root


@pytest.fixture(scope="session")
def tiny_export(tiny_pair, tiny_template, tmp_path_factory) -> tuple[Path, dict]:
    """The tiny pair exported (light quant auto) into a repository; (out_dir, report)."""
    heavy, light = tiny_pair
    out = tmp_path_factory.getbasetemp() / "repo"  # fixed: a second instance is up to date
    report = export_pair(heavy, light, out, ExportOptions(template=tiny_template))
    return out, report
