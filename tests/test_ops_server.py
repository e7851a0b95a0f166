"""Through a real tritonserver (tiny pair): metrics add up to routing_stats; the roll-back switch.

Uses the shared tiny repository (tests/conftest.py) copied, since it rewrites the router
config. ~1-2 min on 2 CPU cores.
"""
from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tokenrouter_backend.client import triton_client

pytestmark = pytest.mark.triton  # every test here talks to a real tritonserver

PROMPTS = ["def add(a, b):", "for i in range(", "import numpy as", "class Stack:", "while True:", "print("]
COUNTERS = {  # metric (summed over labels) -> routing_stats field
    "tokenrouter_router_generated_tokens_total": "generated_tokens",
    "tokenrouter_router_drafts_accepted_total": "drafts_accepted",
    "tokenrouter_router_drafts_proposed_total": "drafts_proposed",
    "tokenrouter_router_rollbacks_total": "rollbacks",
    "tokenrouter_router_prompt_tokens_total": "prompt_tokens",
    "tokenrouter_router_light_copy_drafts_proposed_total": "light_copy_drafts_proposed",
    "tokenrouter_router_light_copy_drafts_accepted_total": "light_copy_drafts_accepted",
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory, tiny_repository) -> Path:
    """A private copy of the tiny repository: these tests rewrite the router's config
    (and turn the branches' share_cores on)."""
    out = tmp_path_factory.mktemp("ops_repo") / "repo"
    shutil.copytree(tiny_repository, out, symlinks=True)
    for branch in ("heavy", "light"):
        set_params(out / branch / "config.pbtxt", share_cores="true")
    return out


def set_router_params(repo: Path, **params) -> None:
    set_params(repo / "router" / "config.pbtxt", **params)


def set_params(cfg: Path, **params) -> None:
    text = cfg.read_text()
    for key, value in params.items():
        text, n = re.subn(rf'(key: "{key}",? value: {{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert n == 1, key
    cfg.write_text(text)


def scrape(url: str, prefix: str = "tokenrouter_router_") -> dict:
    """{(name, labels string): value} of the lines whose metric starts with prefix."""
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(rf"({prefix}\w+)(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def total(metrics: dict, name: str, **labels) -> float:
    return sum(v for (n, lab), v in metrics.items()
               if n == name and all(f'{k}="{val}"' in lab for k, val in labels.items()))


def test_metrics_add_up_and_switch(repository, start_triton, tmp_path):
    override = tmp_path / "override.json"
    set_router_params(repository, mode="route", override_file=str(override), override_check_ms="50",
                      decision_log_path=str(tmp_path / "decisions.jsonl"))
    server = start_triton(repository)
    url = server.http_url.replace("http://", "")
    stats = []
    for i, prompt in enumerate(PROMPTS):
        mode = ("route", "verify", "heavy")[i % 3]
        res = triton_client.generate_http(url, prompt, max_tokens=24, router_mode=mode, decision_log=True)
        stats.append(res.stats)
    deadline, metrics = time.time() + 10, {}
    while time.time() < deadline:
        metrics = scrape(server.metrics_url)
        if total(metrics, "tokenrouter_router_requests_total") >= len(PROMPTS):
            break
        time.sleep(0.2)
    assert total(metrics, "tokenrouter_router_requests_total") == len(PROMPTS)
    for name, field in COUNTERS.items():
        assert total(metrics, name) == sum(s[field] for s in stats), name
    for branch in ("light", "heavy"):
        assert total(metrics, "tokenrouter_router_generated_tokens_total", branch=branch) == \
            sum(s[f"{branch}_tokens"] for s in stats)
        assert total(metrics, "tokenrouter_router_branch_calls_total", branch=branch) == \
            sum(s[f"{branch}_calls"] for s in stats)
    assert total(metrics, "tokenrouter_router_e2e_ms_count") == len(PROMPTS)
    # share_cores: every forward of each branch took its turn on the cores
    # or, past core_wait_ms, ran beside the other branch's
    branch = scrape(server.metrics_url, prefix="tokenrouter_branch_")
    for name in ("light", "heavy"):
        forwards = total(branch, "tokenrouter_branch_forward_ms_count", branch=name)
        turns = total(branch, "tokenrouter_branch_core_turns_total", branch=name)
        assert forwards > 0 and turns > 0, name
        assert turns + total(branch, "tokenrouter_branch_core_overlaps_total", branch=name) == forwards, name
    # roll-back switch: route -> heavy without restart, and back
    override.write_text(json.dumps({"mode": "heavy"}))
    time.sleep(0.2)
    forced = triton_client.generate_http(url, PROMPTS[0], max_tokens=16)
    assert forced.stats["mode"] == "heavy" and forced.stats["light_tokens"] == 0
    # metric writes go through the recorder thread (never on the request path): poll briefly
    deadline, active = time.time() + 10, 0.0
    while time.time() < deadline:
        active = total(scrape(server.metrics_url), "tokenrouter_router_override_active", mode="heavy")
        if active == 1:
            break
        time.sleep(0.2)
    assert active == 1
    override.write_text("{}")
    time.sleep(0.2)
    assert triton_client.generate_http(url, PROMPTS[0], max_tokens=16).stats["mode"] == "route"
    log_lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert log_lines and {"request_id", "action"} <= json.loads(log_lines[0]).keys()
