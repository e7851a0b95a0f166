"""The product and the lab live apart: the wheel holds the package and nothing of the lab.

The wheel is built (offline, without build isolation) from a copy of the working tree, so the
checkout gets no ``build/`` folder. It must hold only ``tokenrouter_backend`` and its metadata:
no study, no notebook page, no run record (``research/`` is not packaged), and ``client/`` —
the code that talks to a running server — stays small, the benchmarks living in ``bench/``.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tokenrouter_backend"
CLIENT_MAX_LINES = 600
PACKAGE_DATA = {f"{PACKAGE}/export/routers/demo_pair.json"}  # pyproject's package-data: the demo router
RECORD_SUFFIXES = {".md", ".jsonl", ".png", ".csv", ".txt", ".ipynb"}
NOT_COPIED = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                    ".pytest_cache", ".ruff_cache", "bench_results", "bench_out", "out", "results",
                                    "*.onnx", "*.onnx.data", "*.gguf")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("house")
    src, out = tmp / "src", tmp / "dist"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED, symlinks=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(out), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("*.whl")
    archive = zipfile.ZipFile(wheel)
    return archive, archive.namelist()


def test_package_holds_no_lab(wheel_names):
    archive, names = wheel_names
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert tops - {PACKAGE} == {t for t in tops if t.endswith(".dist-info")}, f"top-level entries: {sorted(tops)}"
    in_package = [PurePosixPath(n) for n in names if n.startswith(f"{PACKAGE}/")]
    lab = [str(p) for p in in_package
           if "research" in p.parts or "notebook" in p.parts or "records" in p.parts
           or p.stem.endswith("_study")
           or (p.suffix in RECORD_SUFFIXES)
           or (p.suffix == ".json" and str(p) not in PACKAGE_DATA)]
    assert not lab, f"lab files in the wheel: {lab}"
    assert any(str(p) == f"{PACKAGE}/bench/bench.py" for p in in_package), "the benchmarks are part of the product"
    client = [n for n in names if n.startswith(f"{PACKAGE}/client/") and n.endswith(".py")]
    lines = sum(archive.read(n).decode("utf-8").count("\n") for n in client)
    assert client and lines <= CLIENT_MAX_LINES, f"client/ holds {lines} lines in {len(client)} modules"
