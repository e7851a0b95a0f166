"""``tokenrouter export`` is quiet: one line per stage on the console, library noise in a log.

The CLI runs in a subprocess on the tiny pair (as a user runs it), so file-descriptor output
of torch, transformers and ONNX Runtime is seen as a terminal would see it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tokenrouter_backend.export import progress
from tokenrouter_backend.export.tiny_pair import build_tiny_pair
from tokenrouter_backend.server import paths

ROOT = Path(__file__).resolve().parents[1]
NOISE = re.compile(r"TracerWarning|FutureWarning|UserWarning|DeprecationWarning|warnings\.warn"
                   r"|WARNING:|it/s\]|\d+%\|")
MAX_LINES = 16  # tokenizer + 3 heavy + 2 light + 3 quantize candidates + repository + summary


def _export(heavy: Path, light: Path, out: Path, log: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "tokenrouter_backend", "export", "--heavy", str(heavy),
         "--light", str(light), "--out", str(out), "--log", str(log)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cold_export(tmp_path_factory):
    heavy, light = build_tiny_pair(paths.tiny_dir())  # stamp-checked: built once per data dir
    tmp = tmp_path_factory.mktemp("quiet_export")
    out, log = tmp / "repo", tmp / "export.log"
    return heavy, light, out, log, _export(heavy, light, out, log)


def test_cold_export_prints_one_line_per_stage(cold_export):
    _, _, out, log, result = cold_export
    console = result.stdout + result.stderr
    assert result.returncode == 0, console
    lines = console.splitlines()
    assert len(lines) <= MAX_LINES, console
    assert not [line for line in lines if NOISE.search(line)], console
    for stage in ("tokenizer: load", "heavy: load", "heavy: export ONNX", "heavy: validate",
                  "light: load", "light: export ONNX", "light: quantize", "repository: fill"):
        assert any(line.startswith(stage) and re.search(r" \d+\.\d s$", line) for line in lines), \
            f"no timed {stage!r} line in:\n{console}"
    assert (out / "heavy" / "config.pbtxt").is_file()


def test_library_warnings_land_in_the_log(cold_export):
    _, _, _, log, result = cold_export
    text = log.read_text() if log.exists() else ""
    hidden = re.search(r"library output \((\d+) lines", result.stdout)
    if hidden is None:  # only when the libraries emitted nothing (other versions): not shown either
        assert not NOISE.search(result.stdout + result.stderr), result.stdout + result.stderr
        assert all(line.startswith("===== ") for line in text.splitlines()), text[:2000]
        return
    assert int(hidden.group(1)) > 0 and str(log) in result.stdout
    assert "===== heavy: export ONNX" in text  # each stage's output under its title
    assert re.search(r"Warning|WARNING", text), text[:2000]  # the torch tracer's warnings


def test_second_run_is_up_to_date_and_short(cold_export):
    heavy, light, out, log, _ = cold_export
    result = _export(heavy, light, out, log)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console
    assert "heavy: export ONNX" not in console and console.count("up to date") == 2, console
    assert len(console.splitlines()) <= 6, console


def test_errors_stay_on_stderr(tmp_path):
    log = tmp_path / "x.log"
    result = _export(tmp_path / "no-such-heavy", tmp_path / "no-such-light", tmp_path / "repo", log)
    assert result.returncode == 1
    assert "tokenrouter export:" in result.stderr and "no-such-heavy" in result.stderr, result.stderr


def test_stage_sends_warnings_and_fd_output_to_the_log(tmp_path, capfd):
    log = progress.ExportLog(tmp_path / "l.log", console=sys.stdout)
    with progress.active(log), progress.stage("heavy", "work"):
        warnings.warn("a library warning", UserWarning, stacklevel=1)
        os.write(2, b"c-level noise\n")
        os.write(1, b"stdout noise\n")
    out, err = capfd.readouterr()
    assert re.fullmatch(r"heavy: work \.\.\. \d+\.\d s\n", out) and err == "", (out, err)
    text = (tmp_path / "l.log").read_text()
    assert "a library warning" in text and "c-level noise" in text and "stdout noise" in text
    assert log.noise_lines >= 3
    with progress.stage("heavy", "no active log"):  # library use: nothing printed, nothing caught
        os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"


def test_failed_stage_says_where_the_log_is_and_raises(tmp_path, capfd):
    log = progress.ExportLog(tmp_path / "f.log", console=sys.stdout)
    with pytest.raises(RuntimeError, match="boom"), progress.active(log), progress.stage("light", "quantize"):
        os.write(2, b"library detail\n")
        raise RuntimeError("boom")
    out, err = capfd.readouterr()
    assert out.startswith("light: quantize ... failed after ") and str(tmp_path / "f.log") in out, out
    assert err == "" and "library detail" in (tmp_path / "f.log").read_text()
    os.write(2, b"after\n")  # file descriptors are restored after the failure
    assert capfd.readouterr().err == "after\n"
