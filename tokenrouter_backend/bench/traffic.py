"""Real-traffic cases side by side: long retrieved contexts and mixed concurrent requests.

``python -m tokenrouter_backend.bench.traffic --url HOST:PORT --repo REPO`` runs, against a
running server, each case for every mode (arms interleaved, their order rotated by one each
round, ``--rounds`` rounds) and reports per mode the wall time, time to first token, inter-token
gaps and tokens/s, the ratios to heavy-only of the same round, and the peak resident memory
each branch stub added during the case (sampled every 50 ms; stubs found by REPO's path):

* ``short``: one short code completion;
* ``long-N``: one RAG-like prompt of about N tokens (retrieved source files + a question);
* ``mix``: 6 short + 2 long prompts sent at once (the short requests' worst latency counts).

RAG-like prompts are built from this Python's standard-library sources, so every machine
builds the same ones. Output: a table on stdout and ``OUT/traffic.json``.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenrouter_backend.client import triton_client

from .arm_prompts import NO_REUSE_KNOBS, for_arm
from .workloads import CODE_PROMPTS

MODES = ("heavy", "verify", "route")
SOURCES = ("textwrap.py", "string.py", "heapq.py", "bisect.py", "queue.py", "functools.py", "shlex.py",
           "fnmatch.py", "glob.py", "difflib.py", "configparser.py", "argparse.py")
CHARS_PER_TOKEN = 4.0  # Qwen's tokenizer on this text (measured: 3.2 sized 2800 as 2226); used without a tokenizer
HEADER = "# Context documents\n"
QUESTION = "\n\n# Question: using the code above, write a function `summary()` that returns a one-line " \
           "description of what this module does.\ndef summary():\n"


def rag_prompt(tokens: int, offset: int = 0, tokenizer=None) -> str:
    """About ``tokens`` tokens of retrieved standard-library source, then a question; with a
    ``tokenizers.Tokenizer`` the context is cut at a token boundary so the whole prompt has
    ``tokens`` tokens (give or take one where the cut re-tokenizes)."""
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    text, i = "", offset
    while len(text) < tokens * (CHARS_PER_TOKEN + 2):
        name = SOURCES[i % len(SOURCES)]
        text += f"\n# ---- retrieved: {name}\n" + (lib / name).read_text()[: 4000]
        i += 1
    if tokenizer is None:
        return HEADER + text[: int(tokens * CHARS_PER_TOKEN)] + QUESTION
    room = tokens - len(tokenizer.encode(HEADER + QUESTION, add_special_tokens=False).ids)
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return HEADER + text[: offsets[max(0, min(room, len(offsets)) - 1)][1]] + QUESTION


def repo_tokenizer(repo: Path | None):
    """The exported tokenizer of a model repository (None without a repository)."""
    if repo is None:
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def short_prompts() -> list[str]:
    return list(CODE_PROMPTS.values())


@dataclass
class Sample:
    """One request of one case in one mode."""

    kind: str  # short | long
    tokens: int
    prompt_tokens: int
    latency_s: float
    ttft_s: float
    max_gap_s: float
    light_skipped: bool = False
    stats: dict = field(default_factory=dict)  # the request's routing_stats


@dataclass
class CaseRun:
    case: str
    mode: str
    round: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)
    rss_added_mb: dict = field(default_factory=dict)  # branch -> peak resident MB above the start

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.samples) / self.wall_s if self.wall_s else 0.0


class RssSampler:
    """Peak resident memory of the branch stubs serving ``repo`` while a case runs."""

    def __init__(self, repo: Path | None):
        self.repo, self.peak, self.base = repo, {}, {}
        self._stop = threading.Event()
        self._thread = None

    def _now(self) -> dict:
        import psutil

        out = {}
        for proc in psutil.process_iter(["cmdline", "memory_info"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            for name in ("heavy", "light"):
                if "triton_python_backend_stub" in cmd and f"{self.repo}/{name}/1/model.py" in cmd:
                    out[name] = proc.info["memory_info"].rss
        return out

    def __enter__(self):
        if self.repo is not None:
            self.base = self._now()
            self.peak = dict(self.base)
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(0.05):
            for name, rss in self._now().items():
                self.peak[name] = max(self.peak.get(name, 0), rss)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def added_mb(self) -> dict:
        return {n: round((self.peak.get(n, 0) - b) / 2**20, 1) for n, b in self.base.items()}


def one(url: str, prompt: str, kind: str, mode: str, max_tokens: int) -> Sample:
    r = triton_client.generate_grpc(url, prompt, stream=True, router_mode=mode, max_tokens=max_tokens,
                                    timeout_s=1800, **NO_REUSE_KNOBS)
    gaps = r.inter_token_gaps
    return Sample(kind, r.tokens, int(r.stats.get("prompt_tokens", 0)), r.latency_s, r.ttft_s,
                  max(gaps) if gaps else 0.0, bool(r.stats.get("light_skipped", False)), dict(r.stats))


def run_case(url: str, case: str, requests: list[tuple[str, str]], mode: str, max_tokens: int,
             rnd: int, repo: Path | None) -> CaseRun:
    with RssSampler(repo) as rss:
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(len(requests)) as pool:
            samples = list(pool.map(lambda ikp: one(url, for_arm(ikp[1][1], case, mode, rnd, ikp[0]), ikp[1][0],
                                                    mode, max_tokens), enumerate(requests)))
        wall = time.perf_counter() - t0
    return CaseRun(case, mode, rnd, wall, samples, rss.added_mb())


def cases(long_tokens: list[int], tokenizer=None) -> dict[str, list[tuple[str, str]]]:
    shorts = short_prompts()
    out = {"short": [("short", shorts[0])]}
    for n in long_tokens:
        out[f"long-{n}"] = [("long", rag_prompt(n, tokenizer=tokenizer))]
    out["mix"] = [("short", shorts[i % len(shorts)]) for i in range(6)] + \
        [("long", rag_prompt(1200, offset=k, tokenizer=tokenizer)) for k in (3, 7)]
    return out


def summarize(runs: list[CaseRun]) -> list[dict]:
    """Per case and mode: medians over rounds, and ratios to heavy-only of the same round."""
    rows = []
    for case in dict.fromkeys(r.case for r in runs):
        for mode in dict.fromkeys(r.mode for r in runs if r.case == case):
            mine = [r for r in runs if r.case == case and r.mode == mode]
            heavy = {r.round: r for r in runs if r.case == case and r.mode == "heavy"}
            shorts = [max(s.latency_s for s in r.samples if s.kind == "short") for r in mine
                      if any(s.kind == "short" for s in r.samples)]
            rows.append({
                "case": case, "mode": mode, "rounds": len(mine),
                "wall_s": statistics.median(r.wall_s for r in mine),
                "tokens_per_s": statistics.median(r.tokens_per_s for r in mine),
                "speedup": statistics.median(r.tokens_per_s / heavy[r.round].tokens_per_s for r in mine),
                "ttft_s": statistics.median(max(s.ttft_s for s in r.samples) for r in mine),
                "ttft_ratio": statistics.median(max(s.ttft_s for s in r.samples)
                                                / max(s.ttft_s for s in heavy[r.round].samples) for r in mine),
                "max_gap_s": statistics.median(max(s.max_gap_s for s in r.samples) for r in mine),
                "worst_short_s": statistics.median(shorts) if shorts else None,
                "light_skipped": sum(s.light_skipped for r in mine for s in r.samples),
                "rss_added_mb": {b: max(r.rss_added_mb.get(b, 0) for r in mine) for b in ("heavy", "light")},
            })
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'case':10} {'mode':7} {'wall s':>7} {'tok/s':>6} {'x heavy':>7} {'TTFT s':>7} {'TTFT x':>6} "
          f"{'max gap':>7} {'worst short':>11} {'skip':>4}  RSS added MB (heavy/light)")
    for r in rows:
        worst = f"{r['worst_short_s']:.1f}" if r["worst_short_s"] is not None else "-"
        print(f"{r['case']:10} {r['mode']:7} {r['wall_s']:7.1f} {r['tokens_per_s']:6.2f} {r['speedup']:7.2f} "
              f"{r['ttft_s']:7.1f} {r['ttft_ratio']:6.2f} {r['max_gap_s']:7.2f} {worst:>11} "
              f"{r['light_skipped']:4d}  {r['rss_added_mb']['heavy']}/{r['rss_added_mb']['light']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenrouter_backend.bench.traffic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="gRPC host:port of a running TokenRouter server")
    p.add_argument("--repo", type=Path, default=None,
                   help="its model repository (the branch stubs' memory; its tokenizer sizes the long prompts)")
    p.add_argument("--cases", default="short,long-1448,long-2800,mix")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--warmup", type=int, default=2, help="short requests per mode before measuring")
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    a = p.parse_args(argv)
    names = a.cases.split(",")
    longs = [int(n.split("-")[1]) for n in names if n.startswith("long-")]
    table = cases(longs, repo_tokenizer(a.repo))
    modes = a.modes.split(",")
    if "heavy" not in modes:
        p.error("--modes must include heavy (the ratios' reference)")
    for mode in modes:
        for _ in range(a.warmup):  # warm-up also teaches the router's cost curves
            one(a.url, short_prompts()[1], "short", mode, 16)
    runs = []
    for rnd in range(a.rounds):
        for name in names:
            for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:  # rotated: drift hits every mode
                run = run_case(a.url, name, table[name], mode, a.max_tokens, rnd, a.repo)
                runs.append(run)
                print(f"{name} {mode} round {rnd}: {run.wall_s:.1f} s, {run.tokens_per_s:.2f} tok/s, "
                      f"TTFT {max(s.ttft_s for s in run.samples):.1f} s, RSS +{run.rss_added_mb} MB", flush=True)
    rows = summarize(runs)
    print_table(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "traffic.json").write_text(json.dumps({"rows": rows, "runs": [asdict(r) for r in runs]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
