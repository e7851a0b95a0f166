"""Where TokenRouter keeps its data: demo pair, tiny pair, exported repositories, caches, logs.

Everything lives under one data directory: ``$TOKENROUTER_DATA`` when set, else
``~/.cache/tokenrouter``. Functions (not constants) so a changed environment — a test's
``monkeypatch.setenv`` — takes effect at once.

    <data>/demo/heavy/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    <data>/demo/light/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    <data>/demo/repository/          exported demo model repository
    <data>/tiny/{heavy,light}/       tiny test pair (HF folders)
    <data>/tiny/repository/          exported tiny model repository
    <data>/triton/                   prepared Python-backend directories (stub copies)
    <data>/logs/                     tritonserver logs of `tokenrouter serve`
"""
from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "TOKENROUTER_DATA"
DEFAULT_DATA_DIR = Path("~/.cache/tokenrouter")

DEMO_HEAVY_FILENAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEMO_LIGHT_FILENAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def data_dir() -> Path:
    """The data directory (not created here)."""
    configured = os.environ.get(DATA_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_DATA_DIR.expanduser()


def demo_dir() -> Path:
    return data_dir() / "demo"


def demo_heavy_gguf() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (assembled by `tokenrouter models fetch-demo`)."""
    return demo_dir() / "heavy" / DEMO_HEAVY_FILENAME


def demo_light_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (assembled by `tokenrouter models fetch-demo`)."""
    return demo_dir() / "light" / DEMO_LIGHT_FILENAME


def demo_repository() -> Path:
    """Model repository exported from the demo pair; the default of `tokenrouter serve`."""
    return demo_dir() / "repository"


def tiny_dir() -> Path:
    return data_dir() / "tiny"


def tiny_heavy_dir() -> Path:
    return tiny_dir() / "heavy"


def tiny_light_dir() -> Path:
    return tiny_dir() / "light"


def tiny_repository() -> Path:
    return tiny_dir() / "repository"


def triton_cache_dir() -> Path:
    """Prepared backend directories (Python stub copied beside libtriton_python.so)."""
    return data_dir() / "triton"


def log_dir() -> Path:
    return data_dir() / "logs"
