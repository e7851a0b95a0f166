"""Route quality through a real tritonserver (tiny pair): critical tokens, the learned router.

One server logs verify and route requests: route never lets a number or an end token stand
unchecked (the default class policy). ``tokenrouter train-router`` trains on the verify
logs that same server wrote (their light margins included; outcome labels too); a second
server loads the file (``router_file``) and routes on P(disagree) at half the file's bar
(conservative start): its decision log carries the router's scores, and a request's own bar
(``router_threshold``) moves what stands unchecked. ~2 min on 2 CPU cores.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tokenrouter_backend.cli import main as cli_main
from tokenrouter_backend.client import triton_client
from tokenrouter_backend.core.loop.hooks import Action
from tokenrouter_backend.core.signals.learned_router import LearnedRouter
from tokenrouter_backend.core.signals.token_classes import TokenClass
from tokenrouter_backend.operations.decision_log import read_log

pytestmark = pytest.mark.triton

PROMPTS = ["def add(a, b):", "for i in range(10):", "x = 3 +", "class Stack:", "while n > 0:", "print(",
           "values = [1, 2, 3, 4,", "if key in table:", "total = 0\nfor", "    def __init__(self, size=8):",
           "import os\n", "result = [0, 0,", "width = 12 *", "# compute the sum\n", "elif x ==", "data = {"]
# the tiny pair is unsure of almost everything (median top-1 ~0.06): low bars so drafts stand at all
LOW_BARS = {"draft_confidence_threshold": 0.0, "block_size": 4}


def set_router_params(repo: Path, **params) -> None:
    cfg = repo / "router" / "config.pbtxt"
    text = cfg.read_text()
    for key, value in params.items():
        text, n = re.subn(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert n == 1, key
    cfg.write_text(text)


def wait_for_lines(path: Path, at_least: int, timeout_s: float = 15.0) -> list:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        records = list(read_log(path)) if path.exists() else []
        if len(records) >= at_least:
            time.sleep(1.0)  # the writer flushes every 0.5 s: take the rest too
            return list(read_log(path))
        time.sleep(0.2)
    raise AssertionError(f"{path}: fewer than {at_least} decision-log lines after {timeout_s} s")


def run_all(url: str, mode: str, **knobs) -> list[dict]:
    return [triton_client.generate_http(url, p, max_tokens=40, router_mode=mode, decision_log=True, **knobs).stats
            for p in PROMPTS]


@pytest.fixture(scope="module")
def repository(tmp_path_factory, tiny_repository) -> Path:
    out = tmp_path_factory.mktemp("route_quality") / "repo"
    shutil.copytree(tiny_repository, out, symlinks=True)
    return out


def test_critical_tokens_and_a_router_trained_on_the_servers_own_logs(repository, start_triton, tmp_path, capsys):
    log1 = tmp_path / "first.jsonl"
    # the tiny pair drafts hardly a digit: line starts (which it drafts a lot) are made critical
    set_router_params(repository, decision_log_path=str(log1), cost_model="false", critical_line_start="verify",
                      critical_number="verify")
    server = start_triton(repository)
    url = server.http_url.replace("http://", "")
    run_all(url, "verify", **LOW_BARS)
    route_stats = run_all(url, "route", confidence_threshold=0.03, **LOW_BARS)
    records = wait_for_lines(log1, 2 * len(PROMPTS))
    server.stop()
    route = [r for r in records if r.action in (Action.ACCEPT, Action.FALLBACK)]
    drafted = [c for r in route for c in r.token_class]
    stood = [c for r in route for c in r.token_class[: r.committed_light]]
    assert stood and TokenClass.LINE_START in drafted  # the test sees critical drafts at all
    critical = {TokenClass.LINE_START, TokenClass.NUMBER, TokenClass.END}  # configured + default "verify" classes
    assert not critical & set(stood)
    assert all(s["finish_reason"] in ("length", "end_id", "stop") for s in route_stats)

    verify = [r for r in records if r.action == Action.VERIFY]
    assert verify and all(len(r.token_class) == len(r.drafted) for r in verify)
    # the light branch's margin crossed BLS: one per draft, within [0, top-1 probability]
    assert all(len(r.margin) == len(r.drafted) for r in verify)
    assert all(0.0 <= m <= c + 1e-4 for r in verify for m, c in zip(r.margin, r.confidence))
    outcome_file = tmp_path / "outcome.json"
    rc = cli_main.main(["train-router", str(log1), "--out", str(outcome_file), "--holdout", "0.25",
                        "--labels", "outcome", "--tokenizer", str(repository)])
    printed = capsys.readouterr().out
    assert rc == 0 and "whitespace-only variants" in printed
    with capsys.disabled():
        print("\ntrain-router --labels outcome on the tiny pair's verify logs:\n" + "\n".join(printed.splitlines()[:5]))
    assert LearnedRouter.load(outcome_file).trained["labels"] == "outcome"
    router_file = repository / "router" / "1" / "router.json"
    rc = cli_main.main(["train-router", str(log1), "--out", str(router_file), "--holdout", "0.25"])
    assert rc == 0
    trained = LearnedRouter.load(router_file)
    assert trained.trained["held_out_requests"] >= 1 and "margin" in trained.features

    log2 = tmp_path / "second.jsonl"
    # the conservative start holds the router at half its bar for the whole test (verdicts never reach)
    set_router_params(repository, decision_log_path=str(log2), router_file="router.json", mode="route",
                      ab_route_percent="50", request_policy="true", conservative_start="true",
                      conservative_router_scale="0.5", conservative_router_verdicts="1000000")
    server = start_triton(repository)
    url = server.http_url.replace("http://", "")
    stats = run_all(url, "route", **LOW_BARS)
    records = wait_for_lines(log2, len(PROMPTS))
    scored = [r for r in records if r.action in (Action.ACCEPT, Action.FALLBACK)]
    assert scored and all(len(r.router_score) == len(r.drafted) for r in scored)
    for r in scored:  # what stood unchecked is what the router let through
        for cls, score in zip(r.token_class[: r.committed_light], r.router_score[: r.committed_light]):
            assert cls not in critical and score <= 0.5 * trained.threshold + 1e-6
    assert sum(s["generated_tokens"] for s in stats) > 0
    # a request's own bar (router_threshold, under the start's 0.5 scale): 0 lets no draft stand
    # unchecked, 1 (a bar of 0.5) lets some stand; out of range is refused by name
    def unchecked(**knobs) -> int:
        return sum(len(text) for p in PROMPTS for kind, text in triton_client.generate_http(
            url, p, max_tokens=40, router_mode="route", show_routing=True, answer_cache=False, **LOW_BARS,
            **knobs).stats["routing"]
            if kind == "u")
    assert unchecked(router_threshold=0.0) == 0
    assert unchecked(router_threshold=1.0) > 0
    with pytest.raises(triton_client.GenerationError, match=r"router_threshold must be in \[0\.0, 1\.0\]"):
        triton_client.generate_http(url, PROMPTS[0], max_tokens=4, router_mode="route", router_threshold=1.5)
    # --show-routing's runs join to the answer the same response carries
    shown = triton_client.generate_http(url, PROMPTS[0], max_tokens=24, router_mode="route", show_routing=True)
    runs = shown.stats["routing"]
    assert "".join(text for _, text in runs) == shown.text and {k for k, _ in runs} <= set("uvhr")
    assert sum(len(t) for _, t in runs) == len(shown.text)
    # A/B with request_policy: id-less requests split by prompt; the request arm follows the prompt's score
    hard = [f"Calculate {n} * 7 + 3. You must print exactly one number. What is it?" for n in range(11, 17)]
    easy = [f"Say hello to club {name}" for name in ("red", "blue", "green", "gold", "grey", "pink")]
    mode = {p: triton_client.generate_http(url, p, max_tokens=8).stats["mode"] for p in hard + easy}
    assert "verify" in {mode[p] for p in hard}  # some land in the request arm: verify for hard prompts
    assert {mode[p] for p in easy} == {"route"}  # token arm: route; request arm, easy prompt: route too
    print("\nroute with the learned router:", json.dumps({k: sum(s[k] for s in stats) for k in
                                                           ("generated_tokens", "light_tokens", "heavy_tokens")}))
