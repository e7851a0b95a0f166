"""The routing view: logged answers rebuilt token by token, coloured, and read back from a browser.

`tokenrouter replay LOG --html OUT` rebuilds each request's answer from its blocks (also
across rollbacks) and colours each token by origin; headless Chromium (Debian
``chromium``) loads the page and the test reads back what it shows.
"""
from __future__ import annotations

import asyncio
import html.parser
import shutil
import subprocess

from support.fakes import VOCAB, FakeBranch, ToyLM
from support.ops_helpers import PROMPTS, Recorder
from tokenrouter_backend.cli import main as cli_main
from tokenrouter_backend.client.routing_view import coloured, legend
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.loop.routing_trace import Kind, routing_runs, runs
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.core.signals.token_classes import VocabClasses
from tokenrouter_backend.learning.replay_html import rebuild, render
from tokenrouter_backend.operations.decision_log import DecisionLog, read_log

TEXTS = [str(i) for i in range(10)] + [f" w{i}" for i in range(VOCAB - 10)]


def decode(ids) -> str:
    return "".join(TEXTS[int(i)] for i in ids)


def route_run(prompts=PROMPTS[:8], mode="route"):
    """Route requests that roll back now and then; (records, {request_id: emitted tokens}, stats)."""
    rec, outputs, stats = Recorder(), {}, {}
    gate = RouteGate(ClassPolicy(), VocabClasses.from_texts(TEXTS))
    params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 40, "confidence_threshold": 0.3,
                                              "rollback_threshold": 0.2})
    for i, prompt in enumerate(prompts):
        out: list[int] = []
        request = GenerationRequest(tuple(prompt), params, route_gate=gate)
        stats[f"r{i}"] = asyncio.run(generate(request, FakeBranch("light", ToyLM(seed=2, noise=1.0)),
                                              FakeBranch("heavy", ToyLM()), lambda t, s, f, out=out: out.extend(t),
                                              hooks=rec, request_id=f"r{i}"))
        outputs[f"r{i}"] = out
    return rec.records, outputs, stats


def test_answers_are_rebuilt_from_the_blocks_rollbacks_included():
    records, outputs, stats = route_run()
    assert sum(s.rollbacks for s in stats.values()) > 0  # the rebuild must survive rewrites
    answers = rebuild(records)
    assert {k: [t.id for t in v] for k, v in answers.items()} == outputs
    for rid, s in stats.items():
        assert "".join(t.kind.value for t in answers[rid]) == s.token_kinds
        kinds = set(s.token_kinds)
        assert kinds <= {k.value for k in Kind}
    assert {Kind.LIGHT_UNCHECKED, Kind.HEAVY, Kind.ROLLED_BACK} <= {t.kind for a in answers.values() for t in a}


def test_verify_tokens_are_verified_light_or_heavy():
    _, _, stats = route_run(PROMPTS[:3], mode="verify")
    assert all(set(s.token_kinds) <= {"v", "h"} for s in stats.values())


def test_runs_join_to_the_answer_and_colour_in_the_terminal():
    _, outputs, stats = route_run(PROMPTS[:2])
    tokens, kinds = outputs["r0"], stats["r0"].token_kinds
    got = runs(tokens, kinds, decode)
    assert "".join(t for _, t in got) == decode(tokens)
    assert all(a[0] != b[0] for a, b in zip(got, got[1:]))  # a run per change of origin
    trimmed = routing_runs(tokens, kinds, decode, trim=3)
    assert "".join(t for _, t in trimmed) == decode(tokens)[:-3]
    plain = coloured(got, colour=False)
    assert plain.startswith(f"[{got[0][0]}:") and "\x1b[" not in plain
    assert "\x1b[32m" in coloured([["u", "x"]]) and "light, unchecked 100%" in legend([["u", "x"]], colour=False)


class SpanReader(html.parser.HTMLParser):
    """The token spans of a page: (kind class, data-tip, text)."""

    def __init__(self):
        super().__init__()
        self.spans, self._open = [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "tok" in a.get("class", "").split():
            self._open = [a["class"].split()[1], a.get("data-tip", ""), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(tuple(self._open))
            self._open = None


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    # a failure, not a skip: scripts/setup.sh (make test) installs it, and a skip would pass unseen
    assert path is not None, "headless Chromium is not installed: scripts/setup.sh installs the Debian package chromium"
    return path


def test_replay_html_in_headless_chromium(tmp_path, capsys):
    records, outputs, _ = route_run()
    log_path = tmp_path / "route.jsonl"
    log = DecisionLog(log_path)
    for r in records:
        log.submit(r)
    log.close()
    assert rebuild(read_log(log_path)).keys() == outputs.keys()  # the JSON lines keep what the page needs
    page = tmp_path / "decisions.html"
    assert cli_main.main(["replay", str(log_path), "--html", str(page)]) == 0
    browser = chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path}/c"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    reader = SpanReader()
    reader.feed(dom)
    total = sum(len(v) for v in outputs.values())
    assert len(reader.spans) == total  # one span per token of every answer
    kinds = {cls for cls, _, _ in reader.spans}
    assert {"k-u", "k-h", "k-r"} <= kinds
    unchecked = [tip for cls, tip, _ in reader.spans if cls == "k-u"]
    assert all("light confidence" in tip and "margin " in tip and "class " in tip for tip in unchecked)
    assert any("heavy verdict: not checked" in tip for tip in unchecked)
    assert all("replaced" in tip for cls, tip, _ in reader.spans if cls == "k-r")
    first = "".join(text for _, _, text in reader.spans[: len(outputs["r0"])])
    assert first == "".join(f"⟨{t}⟩" for t in outputs["r0"])
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1000,700", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    page_text = render(records, decode)
    assert " w" in page_text  # with a decoder the tokens show as text
