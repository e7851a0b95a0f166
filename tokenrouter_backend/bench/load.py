"""Load sweeps with perf_analyzer (from the tritonclient wheel) against the ensemble.

``input_data`` writes perf_analyzer's ``--input-data`` JSON from workload prompts (one entry
per prompt; every tensor without its batch dimension, as perf_analyzer expects for
``max_batch_size > 0`` models). ``run_point`` runs one concurrency level with
``-i grpc --async --streaming`` (the ensemble is decoupled) and parses its ``-f`` CSV;
``sweep`` runs concurrency levels per router mode. Each point also writes perf_analyzer's
``--profile-export-file`` (every request's send time and response times), from which
``stream_timing`` takes time to first token and inter-token latency, per request kind
(short / long prompt) when the workload mixes them (``mixed_prompts``).

perf_analyzer needs Debian ``libb64-0d`` and ``libcudart.so.12`` (pip
``nvidia-cuda-runtime-cu12``), which ``perf_env`` puts on ``LD_LIBRARY_PATH``.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenrouter_backend.server.restrictions import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_HEADER_PREFIX

from .arm_prompts import NO_REUSE_KNOBS, for_arm
from .workloads import Prompt

MODEL = "tokenrouter"
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_MODES = ("heavy", "verify", "route")
# count_windows: each measurement window is this many completed requests (time windows are
# useless when one request takes seconds). Stability: perf_analyzer's default (10% over 3
# windows) fails with rc 2 on a 2-core CPU whenever another process takes a core, so, as
# genai-perf does, 999% — every window is accepted and the report covers MAX_TRIALS windows.
LONG_WORKLOAD = "rag"  # the long RAG-like prompts of a mixed workload
WINDOW_REQUESTS = 8
STABILITY_PERCENT = 999
MAX_TRIALS = 3
POINT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class LoadPoint:
    mode: str
    concurrency: int
    throughput_rps: float       # completed requests/s (perf_analyzer "Inferences/Second")
    tokens_per_s: float         # throughput_rps x max_tokens: an upper bound if requests stop early
    p50_latency_ms: float
    p99_latency_ms: float
    avg_latency_ms: float
    csv_row: dict
    timing: dict | None = None  # stream_timing of the profile export (TTFT / ITL percentiles)


def input_data(prompts: list[Prompt], mode: str, max_tokens: int, extra: dict | None = None) -> dict:
    """perf_analyzer --input-data JSON: one request per prompt, all inputs shape [1]."""
    rows = []
    for p in prompts:
        row = {"text_input": [p.text], "max_tokens": [int(max_tokens)], "stream": [True],
               "router_mode": [mode]}
        for k, v in (extra or {}).items():
            row[k] = [v]
        rows.append(row)
    return {"data": rows}


def write_input_data(path: Path, prompts: list[Prompt], mode: str, max_tokens: int,
                     extra: dict | None = None) -> Path:
    path.write_text(json.dumps(input_data(prompts, mode, max_tokens, extra), indent=1))
    return path


def perf_analyzer_binary() -> str:
    here = Path(sys.executable).parent / "perf_analyzer"
    found = str(here) if here.exists() else shutil.which("perf_analyzer")
    if not found:
        raise FileNotFoundError("perf_analyzer not found (pip install 'tritonclient[all]==2.51.0')")
    return found


def perf_env() -> dict[str, str]:
    """Environment with libcudart.so.12 from nvidia-cuda-runtime-cu12 on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime as cr

        libdir = str(Path(list(cr.__path__)[0]) / "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    except ImportError:
        pass
    return env


def perf_command(grpc_url: str, data_path: Path, csv_path: Path, concurrency: int,
                 window_requests: int = WINDOW_REQUESTS, profile_path: Path | None = None,
                 admin_key: str | None = None) -> list[str]:
    """perf_analyzer reads the model config, a restricted API: it sends the admin key
    (``admin_key``, else ``$TOKENROUTER_ADMIN_KEY``) when there is one."""
    key = admin_key or os.environ.get(ADMIN_KEY_ENV, "")
    header = ["-H", f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER}:{key}"] if key else []
    cmd = [perf_analyzer_binary(), *header, "-m", MODEL, "-u", grpc_url, "-i", "grpc", "--async", "--streaming",
           "--input-data", str(data_path), "--concurrency-range", f"{concurrency}:{concurrency}",
           "--measurement-mode", "count_windows", "--measurement-request-count", str(window_requests),
           "-s", str(STABILITY_PERCENT), "--max-trials", str(MAX_TRIALS), "--percentile", "99",
           "-f", str(csv_path), "--verbose-csv"]
    if profile_path is not None:
        cmd += ["--profile-export-file", str(profile_path)]
    return cmd


def mixed_prompts(short: list[Prompt], long: list[Prompt], long_share: float) -> list[Prompt]:
    """A request list with ``long_share`` of long prompts, spread evenly (perf_analyzer cycles it)."""
    if not long or long_share <= 0:
        return list(short)
    n = 8 if long_share * 8 == int(long_share * 8) else 20
    n_long = max(1, round(n * long_share))
    out, li, si = [], 0, 0
    for i in range(n):
        if (i + 1) * n_long // n > i * n_long // n:
            out.append(long[li % len(long)])
            li += 1
        else:
            out.append(short[si % len(short)])
            si += 1
    return out


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"p50_ms": round(pick(0.5), 1), "p99_ms": round(pick(0.99), 1), "max_ms": round(v[-1], 1), "n": len(v)}


def stream_timing(profile_path: Path, long_texts: frozenset[str] = frozenset()) -> dict:
    """TTFT / inter-token latency / request latency percentiles from a perf_analyzer profile
    export; split into ``short`` and ``long`` requests (text_input one of ``long_texts``)."""
    data = json.loads(Path(profile_path).read_text())
    groups: dict[str, dict[str, list[float]]] = {}
    for experiment in data.get("experiments", []):
        for req in experiment.get("requests", []):
            times = req.get("response_timestamps") or []
            if not times:
                continue
            text = (req.get("request_inputs") or {}).get("text_input", "")
            kind = "long" if text in long_texts else "short"
            for key in ("all", kind):
                g = groups.setdefault(key, {"ttft": [], "itl": [], "latency": []})
                g["ttft"].append((times[0] - req["timestamp"]) / 1e6)
                g["itl"] += [(b - a) / 1e6 for a, b in zip(times, times[1:])]
                g["latency"].append((times[-1] - req["timestamp"]) / 1e6)
    return {kind: {m: _percentiles(v) for m, v in g.items()} for kind, g in groups.items()}


def parse_csv(csv_path: Path) -> dict:
    """The first data row of perf_analyzer's CSV as a dict (column name -> string)."""
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"no rows in {csv_path}")
    return rows[0]


def _us_to_ms(row: dict, *names: str) -> float:
    for name in names:
        if row.get(name) not in (None, ""):
            return float(row[name]) / 1000.0
    return float("nan")


def point_from_row(mode: str, concurrency: int, max_tokens: int, row: dict) -> LoadPoint:
    rps = float(row["Inferences/Second"])
    avg = sum(_us_to_ms(row, c) for c in ("Client Send", "Network+Server Send/Recv", "Client Recv")
              if row.get(c) not in (None, ""))
    return LoadPoint(mode, concurrency, rps, rps * max_tokens, _us_to_ms(row, "p50 latency"),
                     _us_to_ms(row, "p99 latency"), avg if avg else _us_to_ms(row, "Avg latency"), row)


def point_window(window_requests: int, concurrency: int) -> int:
    """Requests per measurement window at one concurrency: at least one per request in flight.
    A window smaller than the concurrency closes before the requests it counts have all
    started inside it; perf_analyzer then reports "Failed to obtain stable measurement"
    (seen at concurrency 16 with 4-request windows)."""
    return max(window_requests, concurrency)


def run_point(grpc_url: str, prompts: list[Prompt], mode: str, concurrency: int, max_tokens: int,
              work_dir: Path, extra: dict | None = None, window_requests: int = WINDOW_REQUESTS,
              timeout_s: float = POINT_TIMEOUT_S, admin_key: str | None = None) -> LoadPoint:
    work_dir.mkdir(parents=True, exist_ok=True)
    prompts = [dataclasses.replace(p, text=for_arm(p.text, mode, i)) for i, p in enumerate(prompts)]
    data = write_input_data(work_dir / f"input_{mode}.json", prompts, mode, max_tokens,
                            {**NO_REUSE_KNOBS, **(extra or {})})
    csv_path = work_dir / f"perf_{mode}_c{concurrency}.csv"
    profile = work_dir / f"profile_{mode}_c{concurrency}.json"
    profile.unlink(missing_ok=True)  # perf_analyzer refuses an existing export file
    cmd = perf_command(grpc_url, data, csv_path, concurrency, point_window(window_requests, concurrency),
                       profile, admin_key)
    proc = subprocess.run(cmd, env=perf_env(), capture_output=True, text=True, timeout=timeout_s)
    (work_dir / f"perf_{mode}_c{concurrency}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not csv_path.exists():
        raise RuntimeError(f"perf_analyzer failed (rc {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    point = point_from_row(mode, concurrency, max_tokens, parse_csv(csv_path))
    longs = frozenset(p.text for p in prompts if p.workload == LONG_WORKLOAD)
    timing = stream_timing(profile, longs) if profile.exists() else None
    return dataclasses.replace(point, timing=timing)


def sweep(grpc_url: str, prompts: list[Prompt], modes=DEFAULT_MODES, concurrencies=DEFAULT_CONCURRENCY,
          max_tokens: int = 32, work_dir: Path = Path("perf"), extra: dict | None = None,
          window_requests: int = WINDOW_REQUESTS, log=print) -> list[dict]:
    """Every (mode, concurrency) point; a failing point is recorded with its error, not raised."""
    points = []
    for c in concurrencies:            # concurrency outer, modes inner: drift hits modes alike
        for mode in modes:
            try:
                p = asdict(run_point(grpc_url, prompts, mode, c, max_tokens, work_dir,
                                     (extra or {}).get(mode), window_requests))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
                p = {"mode": mode, "concurrency": c, "error": str(exc)[-500:]}
            log(f"load {mode} c={c}: " + (f"{p['throughput_rps']:.3f} req/s p99 {p['p99_latency_ms']:.0f} ms"
                                          if "error" not in p else f"error {p['error'][-200:]}"))
            points.append(p)
    return points


def markdown_table(points: list[dict]) -> str:
    """The sweep as a docs/benchmarks.md table; ratios to heavy-only at the same concurrency."""
    heavy = {p["concurrency"]: p for p in points if p["mode"] == "heavy" and "error" not in p}
    lines = ["| mode | conc. | req/s | x heavy | p50 / p99 latency s | TTFT p50 / p99 s | ITL p50 / p99 ms "
             "| short worst s | long worst s |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        if "error" in p:
            lines.append(f"| {p['mode']} | {p['concurrency']} | error: {p['error'][-80:]} |||||||")
            continue
        t = p.get("timing") or {}
        ref = heavy.get(p["concurrency"])
        ratio = f"{p['throughput_rps'] / ref['throughput_rps']:.2f}" if ref else "-"

        def pct(group, metric, key, scale=1e-3, fmt=".1f", t=t):
            v = t.get(group, {}).get(metric, {}).get(key)
            return "-" if v is None else format(v * scale, fmt)

        lines.append(
            f"| {p['mode']} | {p['concurrency']} | {p['throughput_rps']:.3f} | {ratio} "
            f"| {p['p50_latency_ms'] / 1e3:.1f} / {p['p99_latency_ms'] / 1e3:.1f} "
            f"| {pct('all', 'ttft', 'p50_ms')} / {pct('all', 'ttft', 'p99_ms')} "
            f"| {pct('all', 'itl', 'p50_ms', 1, '.0f')} / {pct('all', 'itl', 'p99_ms', 1, '.0f')} "
            f"| {pct('short', 'latency', 'max_ms')} | {pct('long', 'latency', 'max_ms')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m tokenrouter_backend.bench.load --url HOST:PORT``: the sweep alone, written to OUT/load.json."""
    import argparse

    from .workloads import ALL_WORKLOADS, load_workloads

    p = argparse.ArgumentParser(prog="python -m tokenrouter_backend.bench.load", description=main.__doc__)
    p.add_argument("--url", required=True, help="gRPC host:port")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES))
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    p.add_argument("--workloads", default=",".join(ALL_WORKLOADS))
    p.add_argument("--per-workload", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--window", type=int, default=WINDOW_REQUESTS,
                   help="requests per measurement window (at least the concurrency of the point)")
    p.add_argument("--route-threshold", type=float, default=0.8)
    p.add_argument("--long-share", type=float, default=0.0,
                   help="share of long RAG-like prompts mixed in (e.g. 0.25 = 6 short + 2 long of 8)")
    p.add_argument("--long-tokens", type=int, default=1200, help="length of the long prompts (tokens, about)")
    p.add_argument("--repo", type=Path, default=None, help="the model repository: its tokenizer sizes the long prompts")
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    a = p.parse_args(argv)
    prompts = load_workloads(a.workloads.split(","), per_workload=a.per_workload)
    if a.long_share > 0:
        from .traffic import rag_prompt, repo_tokenizer

        tokenizer = repo_tokenizer(a.repo)
        longs = [Prompt(f"rag/{i}", LONG_WORKLOAD, rag_prompt(a.long_tokens, offset=i, tokenizer=tokenizer))
                 for i in range(3)]
        prompts = mixed_prompts(prompts, longs, a.long_share)
    points = sweep(a.url, prompts, a.modes.split(","), [int(c) for c in a.concurrency.split(",")], a.max_tokens,
                   a.out / "perf", {"route": {"confidence_threshold": a.route_threshold}}, a.window,
                   lambda m: print(m, flush=True))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "load.json").write_text(json.dumps(points, indent=1))
    (a.out / "load.md").write_text(markdown_table(points))
    from .report import LOAD_PNG, plot_load

    plot_load({"load": points}, a.out / LOAD_PNG)  # throughput and p99 latency against concurrency
    print(markdown_table(points))
    return 0 if all("error" not in pt for pt in points) else 1


if __name__ == "__main__":
    sys.exit(main())
