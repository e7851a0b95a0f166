"""`tokenrouter export --router FILE`: the learned router ships in router/1/ and router_file names it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenrouter_backend.core.learned_router import FEATURES, LearnedRouter, RouterFileError
from tokenrouter_backend.export.pipeline import ExportOptions, export_pair
from tokenrouter_backend.server import paths

TEMPLATE = Path(__file__).resolve().parents[1] / "model_repository"


def router(tmp_path) -> Path:
    path = tmp_path / "trained.json"
    n = len(FEATURES)
    LearnedRouter(np.ones(n), 0.0, np.zeros(n), np.ones(n), 0.2, {"note": "hand-set"}).save(path)
    return path


def test_export_ships_the_router(tiny_pair, tmp_path):
    out = tmp_path / "repository"
    export_pair(*tiny_pair, out, ExportOptions(template=TEMPLATE, work_dir=paths.tiny_dir() / "onnx",
                                               router=router(tmp_path)))
    shipped = out / "router" / "1" / "router.json"
    assert LearnedRouter.load(shipped).trained == {"note": "hand-set"}
    assert 'key: "router_file" value: { string_value: "router.json" }' in (out / "router" / "config.pbtxt").read_text()
    plain = tmp_path / "plain"
    export_pair(*tiny_pair, plain, ExportOptions(template=TEMPLATE, work_dir=paths.tiny_dir() / "onnx"))
    assert 'key: "router_file" value: { string_value: "" }' in (plain / "router" / "config.pbtxt").read_text()


def test_a_bad_router_file_is_refused_before_exporting(tiny_pair, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tokenrouter-router", "version": 1, "features": ["x"]}))
    with pytest.raises(RouterFileError, match="router features must be distinct names"):
        export_pair(*tiny_pair, tmp_path / "out", ExportOptions(template=TEMPLATE, router=bad))
    assert not (tmp_path / "out").exists()
