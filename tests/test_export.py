"""Exporter on the tiny pair: parity, INT8 agreement, tokenizer refusal, up-to-date skip,
repository filling and the CLI entry."""
from __future__ import annotations

import argparse
import json
import shutil

import numpy as np
import pytest

from tokenrouter_backend.export import branch_export, branch_stamp, light_pick, pipeline, quantize
from tokenrouter_backend.export.pipeline import ExportOptions, TokenizerMismatch, export_pair
from tokenrouter_backend.export.repository import REQUIRED_PLACEHOLDERS, TemplateError, fill_repository, fill_text
from tokenrouter_backend.export.validate import (
    FP32_REL_TOL,
    INT8_MIN_AGREEMENT,
    ValidationError,
    prompt_ids,
    validate_onnx,
)

INT4_SANE_FLOOR = 0.80  # tiny pair, 4-bit weights (measured 0.84; the demo 0.5B: 0.974)


def test_fp32_parity(tiny_export):
    _, report = tiny_export
    val = report["heavy"]["validation"]
    print("heavy fp32 validation:", json.dumps(val))
    assert val["passed"] and set(val["per_check"]) == {"prefill", "decode", "batch", "scored"}
    assert val["max_abs_diff"] <= FP32_REL_TOL * max(val["logit_scale"], 1.0)
    assert val["per_check"]["batch"]["top1_agreement"] == 1.0


def test_default_quantization_is_the_documented_mode(tiny_export):
    """No --light-quant: the documented default, validated, not timed, with its reason."""
    out, report = tiny_export
    light = report["light"]
    assert ExportOptions().light_quant == quantize.DEFAULT_MODE == "matmulnbits4-int8"
    assert light["precision"] == quantize.PRECISION_NAMES[quantize.DEFAULT_MODE]
    assert set(light["quant_candidates"]) == {quantize.DEFAULT_MODE}
    cand = light["quant_candidates"][quantize.DEFAULT_MODE]
    print(f"light default: top-1 {cand['top1_agreement']:.3f}, {cand['onnx_bytes']} B")
    assert "step_ms_b1" not in cand and "step_ms_b8" not in cand
    assert cand["batch_invariant"] is True
    assert json.loads((out / "light" / "1" / "model.json").read_text())["min_rows"] == 2  # its padding is declared
    assert light["validation"]["top1_agreement"] >= max(INT4_SANE_FLOOR, INT8_MIN_AGREEMENT)
    saved = json.loads((out / "export.json").read_text())
    assert saved["light_quantization"] == {"mode": light["precision"], "reason": quantize.DEFAULT_REASON}
    assert saved["light"]["quant_reason"] == quantize.DEFAULT_REASON


def test_cli_default_is_the_documented_mode():
    parser = argparse.ArgumentParser()
    pipeline.add_arguments(parser)
    args = parser.parse_args(["--heavy", "h", "--light", "l", "--out", "o"])
    assert args.light_quant == quantize.DEFAULT_MODE


def _export_light(tiny_pair, work, monkeypatch, light_quant: str) -> tuple[branch_stamp.BranchBuild, list]:
    """The light branch alone into ``work``; returns (build, the (batch, past) of every timing)."""
    from tokenrouter_backend.export.sources import load_tokenizer, resolve_source

    timings = []

    def counting_step_ms(lm, batch, past_len, **kw):
        timings.append((batch, past_len))
        return 1.0 + batch

    monkeypatch.setattr(light_pick, "step_ms", counting_step_ms)
    source = resolve_source(tiny_pair[1])
    build = branch_export.export_light(source, load_tokenizer(source), work, ExportOptions(light_quant=light_quant))
    return build, timings


def test_only_auto_takes_timings(tiny_pair, tmp_path, monkeypatch):
    build, timings = _export_light(tiny_pair, tmp_path / "default", monkeypatch, quantize.DEFAULT_MODE)
    assert timings == [] and build.precision == quantize.PRECISION_NAMES[quantize.DEFAULT_MODE]
    build, timings = _export_light(tiny_pair, tmp_path / "fixed", monkeypatch, "dynamic")
    assert timings == [] and build.precision == "int8-dynamic"
    assert build.quant_reason.startswith("requested with --light-quant dynamic")
    assert "batch-dependent" in build.quant_reason
    build, timings = _export_light(tiny_pair, tmp_path / "auto", monkeypatch, quantize.AUTO)
    past = light_pick.BENCH_PAST
    assert sorted(timings) == sorted([(1, past), (8, past)] * len(quantize.AUTO_MODES))
    assert set(build.quant_candidates) == set(quantize.AUTO_MODES)
    for mode, cand in build.quant_candidates.items():
        assert (cand["step_ms_b1"], cand["step_ms_b8"]) == (2.0, 9.0), mode  # the timings taken
        assert cand["batch_invariant"] == quantize.BATCH_INVARIANT[mode]
    chosen = quantize.pick_fastest(build.quant_candidates)
    assert build.precision == quantize.PRECISION_NAMES[chosen]
    assert build.quant_reason.startswith("auto: ") and f": {chosen} (" in build.quant_reason
    for mode in quantize.AUTO_MODES:
        assert f"{mode} top-1" in build.quant_reason


def test_stamp_follows_dependency_versions(tiny_export, tiny_pair, monkeypatch):
    """Another onnxruntime (or onnx, torch, transformers) makes a cached branch stale."""
    from tokenrouter_backend.export import versions
    from tokenrouter_backend.export.sources import resolve_source

    out, _ = tiny_export
    saved = json.loads((out / "export.json").read_text())
    assert saved["dependencies"] == versions.dependency_versions()
    assert set(saved["dependencies"]) == set(versions.DEPENDENCIES)
    light_dir = pipeline.default_work_dir(out) / "light"
    source, options = resolve_source(tiny_pair[1]), ExportOptions()
    key = branch_stamp.stamp_key(source, "light", options)
    assert branch_stamp.reused_build(light_dir, key) is not None
    real = versions.version
    for dep in versions.DEPENDENCIES:
        monkeypatch.setattr(versions, "version", lambda n, d=dep, r=real: "0.0.1" if n == d else r(n))
        other = branch_stamp.stamp_key(source, "light", options)
        assert other != key, dep
        assert branch_stamp.reused_build(light_dir, other) is None, dep
        monkeypatch.setattr(versions, "version", real)
    assert branch_stamp.stamp_key(source, "light", options) == key


def test_missing_dependency_is_named():
    from tokenrouter_backend.export import versions

    assert versions.package_version("no-such-distribution-xyz") == versions.NOT_INSTALLED


def test_validation_can_fail(tiny_export, tiny_pair):
    """Reference logits off by more than the bound must fail the export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenrouter_backend.export.validate import reference_logits

    out, _ = tiny_export
    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    prompts = list(prompt_ids(tok))
    refs = reference_logits(AutoModelForCausalLM.from_pretrained(tiny_pair[0]), prompts)
    validate_onnx(out / "heavy" / "1", refs, prompts, "fp32")
    bad = [r + np.float32(0.05) * np.abs(r).max() for r in refs]
    with pytest.raises(ValidationError, match="max_abs_diff"):
        validate_onnx(out / "heavy" / "1", bad, prompts, "fp32")


def test_repository_layout(tiny_export):
    out, report = tiny_export
    for rel in ("heavy/1/model.onnx", "heavy/1/model.json", "light/1/model.onnx", "light/1/model.json",
                "preprocessing/1/tokenizer/tokenizer.json", "postprocessing/1/tokenizer/tokenizer.json",
                "router/1/tokenizer/tokenizer.json",
                "export.json", "light/1/model.py"):
        assert (out / rel).is_file(), rel
    cfg = (out / "heavy" / "config.pbtxt").read_text()
    assert "${" not in cfg and '"fp32"' in cfg
    assert report["placeholders"]["vocab_size"] == 768
    assert json.loads((out / "export.json").read_text())["light"]["precision"] == report["light"]["precision"]


def test_up_to_date_export_is_skipped(tiny_export, tiny_pair, tiny_template):
    out, _ = tiny_export
    onnx = out / "heavy" / "1" / "model.onnx"
    before = onnx.stat().st_mtime_ns
    again = export_pair(*tiny_pair, out, ExportOptions(template=tiny_template))
    assert again["heavy"]["skipped"] and again["light"]["skipped"]
    assert onnx.stat().st_mtime_ns == before


def test_refuses_different_tokenizers(tiny_pair, tiny_template, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "light"
    shutil.copytree(tiny_pair[1], other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<|extra|>"])
    tok.save_pretrained(other)
    with pytest.raises(TokenizerMismatch, match="vocabulary differs"):
        export_pair(tiny_pair[0], other, tmp_path / "repo", ExportOptions(template=tiny_template))
    assert not (tmp_path / "repo").exists()


def test_cli_reports_mismatch(tiny_pair, tmp_path, capsys):
    other = tmp_path / "light"
    shutil.copytree(tiny_pair[1], other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|pad|>"
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    parser = argparse.ArgumentParser()
    pipeline.add_arguments(parser)
    args = parser.parse_args(["--heavy", str(tiny_pair[0]), "--light", str(other), "--out", str(tmp_path / "o")])
    assert pipeline.run(args) == 1
    assert "eos_token differs" in capsys.readouterr().err


def test_unknown_placeholder_is_an_error(tmp_path):
    template = tmp_path / "tmpl"
    (template / "router" / "1").mkdir(parents=True)
    (template / "router" / "config.pbtxt").write_text('name: "router"\nparameters { value: "${block_size}" }\n')
    values = {k: 1 for k in REQUIRED_PLACEHOLDERS}
    tok = tmp_path / "tok"
    tok.mkdir()
    with pytest.raises(TemplateError, match=r"router/config.pbtxt.*\$\{block_size\}"):
        fill_repository(template, tmp_path / "out", values, {}, tok, {})


def test_fill_text():
    assert fill_text("a ${x} b ${y}", {"x": 1, "y": "cpu"}, "f") == "a 1 b cpu"
    with pytest.raises(TemplateError, match=r"f: .*\$\{z\}"):
        fill_text("${z}", {}, "f")


def test_pick_fastest_at_equal_agreement():
    res = {"dynamic": {"top1_agreement": 0.92, "step_ms_b1": 45, "step_ms_b8": 85},
           "matmulnbits8": {"top1_agreement": 1.0, "step_ms_b1": 48, "step_ms_b8": 141},
           "dynamic-per-channel": {"top1_agreement": 0.99, "step_ms_b1": 50, "step_ms_b8": 90}}
    assert quantize.pick_fastest(res) == "dynamic-per-channel"
    res["dynamic"]["top1_agreement"] = 0.99
    assert quantize.pick_fastest(res) == "dynamic"


def test_options_reject_unknown_values():
    with pytest.raises(ValueError, match="--device"):
        ExportOptions(device="tpu")
    with pytest.raises(ValueError, match="--light-quant"):
        ExportOptions(light_quant="int4")


def test_document_end_ids(tmp_path):
    """HF generation_config eos ids and a never-prepended BOS become extra stop tokens."""
    from tokenrouter_backend.export.sources import Source, document_end_ids

    class Tok:
        eos_token_id, bos_token_id = 5, 7

        def __call__(self, text):
            return {"input_ids": [11, 12]}  # BOS not prepended

    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [5, 9]}')
    assert document_end_ids(Source(tmp_path, tmp_path), Tok()) == [7, 9]
    Tok.__call__ = lambda self, text: {"input_ids": [7, 11]}  # BOS prepended: not a stop
    assert document_end_ids(Source(tmp_path, tmp_path, "m.gguf"), Tok()) == []
