"""The AIPerf chat sweep of ``tokenrouter bench --aiperf-url``: users' own measurement.

Against a running OpenAI front (``tokenrouter serve --openai-port``), ``aiperf profile
--endpoint-type chat --streaming`` runs once per (mode, concurrency): concurrency by
concurrency, every mode back to back with their order rotated by one per concurrency, so a
machine getting busier or quieter hits every mode alike. Each point sends
``per_stream`` requests per stream (``--request-count`` = concurrency x that) after warm-up
requests (AIPerf's request rate with max concurrency, a constant schedule far faster than the
server answers: each stream's next request starts within 50 ms of its last one ending; see
``PACING_RATE``), the same synthetic prompts in every mode (``--random-seed``), and keeps the modes
out of each other's caches: ``answer_cache: false`` and a ``cache_salt`` of its own per point
(the prefix cache shares KV only within a salt). Token counts are the server's
(``--use-server-token-count``). Goodput counts the requests within the SLO
(``--goodput``, e.g. ``time_to_first_token:5000 inter_token_latency:1000``, milliseconds).

Writes ``OUT/<mode>-c<concurrency>/`` (AIPerf's artifacts) and returns one row per point
(``aiperf_table.rows``): TTFT p50 / p90, ITL, output tokens/s and goodput, with the ratios
to heavy-only at the same concurrency.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import aiperf_table
from .arm_prompts import nonce

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_MODES = ("heavy", "verify", "route")
DEFAULT_PER_STREAM = 8
DEFAULT_SLO = "time_to_first_token:5000 inter_token_latency:1000"
DEFAULT_ISL, DEFAULT_OSL = 64, 48
WARMUP_REQUESTS = 2
# AIPerf 0.13's concurrency-only mode polls for a free slot without sleeping: its timing process
# holds a whole core while every slot is busy (96% of a core at concurrency 4, measured), half of
# a 2-core server. Request rate with max concurrency sleeps between tries instead: a constant
# schedule this fast keeps every slot busy, each next request starting within 1/rate s.
PACING_RATE = 20.0
AIPERF_ENV = "AIPERF"  # the aiperf executable (default: .venv-aiperf/bin/aiperf, else aiperf on PATH)


@dataclass(frozen=True)
class SweepConfig:
    url: str  # the OpenAI front, http://HOST:PORT
    tokenizer: Path  # the exported tokenizer folder (REPO/preprocessing/1/tokenizer)
    modes: tuple[str, ...] = DEFAULT_MODES
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    per_stream: int = DEFAULT_PER_STREAM
    slo: str = DEFAULT_SLO
    isl: int = DEFAULT_ISL
    osl: int = DEFAULT_OSL
    seed: int = 1

    def __post_init__(self):
        if not self.modes or not self.concurrency:
            raise ValueError("the AIPerf sweep needs at least one mode and one concurrency")
        if self.per_stream < 1 or min(self.concurrency) < 1:
            raise ValueError(f"per_stream and every concurrency must be >= 1; got {self.per_stream}, "
                             f"{self.concurrency}")


def aiperf_binary() -> str:
    """The aiperf to run: $AIPERF, the project's .venv-aiperf, or aiperf on PATH."""
    if os.environ.get(AIPERF_ENV):
        return os.environ[AIPERF_ENV]
    local = Path(".venv-aiperf/bin/aiperf")
    if local.is_file():
        return str(local)
    found = shutil.which("aiperf")
    if found is None:
        raise FileNotFoundError("aiperf not found: python3.11 -m venv .venv-aiperf && "
                                ".venv-aiperf/bin/pip install aiperf==0.13.0, or set $AIPERF")
    return found


def order(config: SweepConfig) -> list[tuple[str, int]]:
    """(mode, concurrency) in run order: concurrency outer, modes rotated by one per concurrency."""
    m = config.modes
    return [(m[(i + j) % len(m)], c) for i, c in enumerate(config.concurrency) for j in range(len(m))]


def command(config: SweepConfig, mode: str, concurrency: int, artifact_dir: Path, binary: str) -> list[str]:
    return [binary, "profile", "--model", "tokenrouter", "--url", config.url, "--endpoint-type", "chat",
            "--streaming", "--concurrency", str(concurrency),
            "--request-rate", str(PACING_RATE), "--arrival-pattern", "constant",
            "--request-count", str(concurrency * config.per_stream),
            "--warmup-request-count", str(max(WARMUP_REQUESTS, concurrency)),
            "--isl", str(config.isl), "--osl", str(config.osl), "--random-seed", str(config.seed),
            "--tokenizer", str(config.tokenizer), "--use-server-token-count",
            "--extra-inputs", f"router_mode:{mode}", "--extra-inputs", "answer_cache:false",
            "--extra-inputs", f"cache_salt:aiperf-{nonce(mode, concurrency, config.seed)}",
            "--goodput", config.slo, "--ui", "none", "--artifact-dir", str(artifact_dir)]


def sweep(config: SweepConfig, out: Path, log: Callable[[str], None] = print,
          run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[dict]:
    """Every point, in ``order``; a failed point stops the sweep with AIPerf's log tail."""
    binary = aiperf_binary()
    out.mkdir(parents=True, exist_ok=True)
    for mode, c in order(config):
        log(f"aiperf: mode {mode}, concurrency {c}, {c * config.per_stream} requests")
        point = out / f"{mode}-c{c}"
        with open(out / f"{mode}-c{c}.log", "w") as sink:
            done = run(command(config, mode, c, point, binary), stdout=sink, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = (out / f"{mode}-c{c}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"aiperf failed at mode {mode}, concurrency {c} (exit {done.returncode}):\n{tail}")
    return aiperf_table.rows(out)
