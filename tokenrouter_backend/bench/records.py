"""The bench's data: arms, one record per run, the records.jsonl format and the results dict.

Both producers of results use this module: ``bench.py`` for a live run and ``report.py`` for
a run cut short (rebuilt from its ``records.jsonl``). ``build_results`` is the one place the
results dict (config, machine, wall_s, records, ratios, summary, load) is put together.
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .scoring import add_quality, paired_ratios, summarize

RECORDS_JSONL = "records.jsonl"  # raw records, written as they complete


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str                      # "triton" | "peer"
    knobs: dict = field(default_factory=dict)


@dataclass
class RunRecord:
    """One arm on one prompt. Stats fields are None where the arm has no such notion."""

    arm: str
    prompt_id: str
    workload: str
    repeat: int
    order: int                     # position of this arm within the prompt's round
    text: str = ""
    tokens: int = 0
    latency_s: float = 0.0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0
    light_share: float | None = None
    heavy_calls_per_token: float | None = None
    mean_accepted: float | None = None
    router_overhead_share: float | None = None
    stats: dict = field(default_factory=dict)
    error: str | None = None
    # quality, filled by scoring.add_quality
    exact_match: bool | None = None
    token_agreement: float | None = None
    common_prefix_tokens: int | None = None
    seq_agreement: float | None = None
    nll: float | None = None
    humaneval_passed: bool | None = None


def append_record(sink: Path, rec: RunRecord) -> None:
    """Append one record to a records.jsonl file (one JSON object per line)."""
    with open(sink, "a") as fh:
        fh.write(json.dumps(asdict(rec)) + "\n")


def read_records(path: Path) -> list[RunRecord]:
    """The records of a records.jsonl file, in file order."""
    return [RunRecord(**json.loads(line)) for line in path.read_text().splitlines()]


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def build_results(config: dict, records: list[RunRecord], prompts: dict, tokenizer, scorer,
                  wall_s: float) -> dict:
    """Score ``records`` in place (quality vs the heavy-only reference) and return the results
    dict: ``prompts`` maps prompt id -> Prompt; ``scorer`` is an NllScorer or None."""
    add_quality(records, prompts, tokenizer, scorer)
    ratios = paired_ratios(records)
    return {"config": config, "machine": machine_info(), "wall_s": round(wall_s, 1),
            "records": [asdict(r) for r in records], "ratios": ratios,
            "summary": summarize(records, ratios), "load": []}
