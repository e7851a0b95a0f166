"""Benchmark results record paths without the machine: bench/portable_paths.py."""
from __future__ import annotations

import tempfile
from pathlib import Path

from tokenrouter_backend.bench.portable_paths import portable_command, portable_path


def test_paths_are_shown_relative_to_where_they_live(tmp_path, monkeypatch):
    data = tmp_path / "data"
    work = tmp_path / "checkout"
    work.mkdir()
    monkeypatch.setenv("TOKENROUTER_DATA", str(data))
    monkeypatch.chdir(work)
    assert portable_path(data / "demo" / "repository") == "<data>/demo/repository"
    assert portable_path(str(data)) == "<data>"
    assert portable_path(work / "bench_results" / "x") == "bench_results/x"
    assert portable_path(Path.home() / ".cache" / "other") == "~/.cache/other"
    assert portable_path("/nowhere-known/deep/model.gguf") == "<abs>/model.gguf"
    assert portable_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # not a path: unchanged
    assert portable_path(None) is None


def test_command_line_paths_are_portable(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENROUTER_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    tmp = Path(tempfile.gettempdir()).resolve()
    argv = [str(tmp_path / "tokenrouter_backend" / "cli.py"), "bench", "--repo",
            str(tmp_path / "data" / "demo" / "repository"), f"--out={tmp_path / 'out'}",
            "--per-workload", "2"]
    cmd = portable_command(argv)
    assert cmd == ("tokenrouter_backend/cli.py bench --repo <data>/demo/repository --out=out "
                   "--per-workload 2")
    assert portable_path(tmp / "zz-elsewhere") == "<tmp>/zz-elsewhere"
