"""`tokenrouter export --router FILE`: the learned router ships in router/1/ and router_file names it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenrouter_backend.core.signals.learned_router import FEATURES, LearnedRouter, RouterFileError
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
    assert 'key: "router_threshold" value: { string_value: "" }' in (out / "router" / "config.pbtxt").read_text()


def test_export_sets_the_repository_bar_and_the_router_gate_reads_it(tiny_pair, tmp_path):
    """--router-threshold writes the repository's P(disagree) bar; the router the server loads
    from that config has it as its bar, not the file's own 0.2."""
    import re

    from tokenrouter_backend.operations.route_setup import load_router

    out = tmp_path / "repository"
    export_pair(*tiny_pair, out, ExportOptions(template=TEMPLATE, work_dir=paths.tiny_dir() / "onnx",
                                               router=router(tmp_path), router_threshold=0.05))
    config = (out / "router" / "config.pbtxt").read_text()
    assert 'key: "router_threshold" value: { string_value: "0.05" }' in config
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', config))
    assert load_router(params, out / "router" / "1").threshold == pytest.approx(0.05)
    assert load_router({**params, "router_threshold": ""}, out / "router" / "1").threshold == pytest.approx(0.2)


def test_a_bad_router_file_is_refused_before_exporting(tiny_pair, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tokenrouter-router", "version": 1, "features": ["x"]}))
    with pytest.raises(RouterFileError, match="router features must be distinct names"):
        export_pair(*tiny_pair, tmp_path / "out", ExportOptions(template=TEMPLATE, router=bad))
    assert not (tmp_path / "out").exists()


def test_export_trains_a_router_for_its_pair(tiny_pair, tmp_path):
    """--train-router: verify logs of the exporter's own prompts through the exported ONNX
    branches, a router trained on them, its records and report beside it; train-router on
    the shipped records gives the same router (they are the logs it was trained on)."""
    from tokenrouter_backend.cli import main as cli_main
    from tokenrouter_backend.learning.router_prompts import training_prompts
    from tokenrouter_backend.operations.decision_log import read_log

    out = tmp_path / "repository"
    report = export_pair(*tiny_pair, out, ExportOptions(template=TEMPLATE, work_dir=paths.tiny_dir() / "onnx",
                                                        train_router=True, router_tokens=24))
    version_dir = out / "router" / "1"
    built = LearnedRouter.load(version_dir / "router.json")
    assert 'key: "router_file" value: { string_value: "router.json" }' in (out / "router" / "config.pbtxt").read_text()
    assert built.trained["source"] == "tokenrouter export --train-router"
    assert built.trained["prompts"] == len(training_prompts()) and "margin" in built.features
    records = list(read_log(version_dir / "router_train.jsonl"))
    assert {r.request_id for r in records} == {f"export/{p.name}" for p in training_prompts()}
    drafted = [r for r in records if r.drafted]
    assert drafted and all(r.mode == "verify" and len(r.margin) == len(r.drafted) == len(r.token_class)
                           for r in drafted)
    verdicts = sum(len(r.heavy_agree) for r in records)
    assert built.trained["train_tokens"] + built.trained["held_out_tokens"] == verdicts
    assert "held-out route replay" in (version_dir / "router_report.txt").read_text()
    assert json.loads((out / "export.json").read_text())["router"]["train_tokens"] == built.trained["train_tokens"]
    assert report["router"]["prompts"] == len(training_prompts())
    again = tmp_path / "again.json"
    assert cli_main.main(["train-router", str(version_dir / "router_train.jsonl"), "--out", str(again),
                          "--holdout", "0.25"]) == 0
    retrained = LearnedRouter.load(again)
    assert np.allclose(retrained.weights, built.weights) and retrained.threshold == built.threshold


def test_train_router_options_are_checked(tiny_pair, tmp_path):
    for options, match in ((dict(train_router=True, router_tokens=4), "--router-tokens must be in"),
                           (dict(train_router=True, router=router(tmp_path)), "do not also give --router"),
                           (dict(train_router=True, template=None), "--train-router needs"),
                           (dict(router=router(tmp_path), router_threshold=1.5),
                            r"--router-threshold must be in \[0, 1\]"),
                           (dict(router_threshold=0.05), "--router-threshold needs a learned router")):
        with pytest.raises(ValueError, match=match):
            ExportOptions(**{"template": TEMPLATE, **options})


@pytest.mark.triton
def test_a_server_routes_with_the_router_its_export_trained(tiny_pair, tmp_path, start_triton):
    """`tokenrouter export --train-router`, then a real tritonserver on that repository: every
    route block's logged P(disagree) is the exported router's score of the logged features."""
    import time

    from support.triton_repo import set_params
    from tokenrouter_backend.cli import main as cli_main
    from tokenrouter_backend.client import triton_client
    from tokenrouter_backend.core.loop.hooks import Action
    from tokenrouter_backend.core.signals.learned_router import feature_matrix
    from tokenrouter_backend.operations.decision_log import read_log

    out = tmp_path / "repository"
    heavy, light = tiny_pair
    assert cli_main.main(["export", "--heavy", str(heavy), "--light", str(light), "--out", str(out),
                          "--work-dir", str(paths.tiny_dir() / "onnx"), "--train-router", "--router-tokens", "16"]) == 0
    built = LearnedRouter.load(out / "router" / "1" / "router.json")
    log = tmp_path / "route.jsonl"
    set_params(out / "router" / "config.pbtxt", decision_log_path=str(log), cost_model="false")
    server = start_triton(out)
    url = server.http_url.replace("http://", "")
    prompts = ["def area(w, h):", "for item in items:", "class Point:", "# read the file\n", "total = 0\n"]
    for p in prompts:
        stats = triton_client.generate_http(url, p, max_tokens=24, router_mode="route", decision_log=True,
                                            draft_confidence_threshold=0.0, block_size=4).stats
        assert stats["generated_tokens"] > 0
    deadline = time.time() + 15
    while time.time() < deadline and len(list(read_log(log)) if log.exists() else []) < len(prompts):
        time.sleep(0.3)
    time.sleep(1.0)  # the writer flushes every 0.5 s
    scored = [r for r in read_log(log) if r.action in (Action.ACCEPT, Action.FALLBACK)]
    assert scored
    for r in scored:
        features = feature_matrix(r.confidence, r.entropy, r.token_class, r.position + np.arange(len(r.drafted)),
                                  r.acceptance, r.margin)
        assert np.allclose(built.p_disagree(features), r.router_score, atol=2e-3)
