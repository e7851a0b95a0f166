"""``tokenrouter bench``: TokenRouter's modes side by side with transformers peers.

Arms through Triton (gRPC streaming, single stream): ``heavy``, ``light``, ``verify``,
``route@T`` for each confidence threshold T (the confidence rule: ``learned_router`` false,
so a server's learned router does not replace it), ``router`` (route with the server's
learned router; ``router@T`` with the request bar ``router_threshold`` T for each of
``--router-thresholds``) and ``request`` (no ``router_mode``: the server decides; with
``request_policy`` true and ``ab_route_percent`` 0 that is request-level routing for every
such request, and its records carry the mode it chose); in-process peers on the same pair
(see ``peers.py``). Arms run INTERLEAVED prompt by prompt (arm order rotated per prompt), so
machine drift hits every arm alike. Speed ratios come only from PAIRED runs: the same
prompt and repeat, arm vs baseline (``heavy``, ``hf_heavy``, ``hf_assisted``); the report
gives per-prompt ratios, their median and IQR. Quality is measured against heavy-only greedy
output of the same prompt (the ``heavy`` arm; ``hf_heavy`` if that arm is absent).

Writes OUT/results.json (every record, ratio and summary), OUT/results.md and PNG plots.
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tokenrouter_backend.server.restrictions import ADMIN_KEY_ENV

from . import aiperf_sweep, report
from .arm_prompts import PREWARM_REQUESTS
from .portable_paths import portable_command, portable_path
from .records import RECORDS_JSONL, Arm, RunRecord, append_record, build_results
from .short_answers import SHORT, SHORT_RAG, short_answer_prompts
from .workloads import ALL_WORKLOADS, QUICK_PER_WORKLOAD, Prompt, load_workloads

CHAT_WORKLOADS = (SHORT, SHORT_RAG)  # rendered by the repository's chat template (--repo)

DEFAULT_MAX_TOKENS = 64
DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)  # route confidence thresholds: the frontier
QUICK_THRESHOLDS = (0.8,)
TRITON_MODES = ("heavy", "light", "verify", "route")  # the default --modes
EXTRA_MODES = ("router", "request")  # asked for by name (they need a router file / the request policy)
WARMUP_TOKENS = 4
REQUEST_TIMEOUT_S = 900.0


def make_arms(modes: list[str], thresholds: list[float], peer_arms: tuple[str, ...],
              router_thresholds: tuple[float, ...] = ()) -> list[Arm]:
    """The arms of a run; ``router`` also gives ``router@T`` per learned-router bar T (request
    input ``router_threshold``: the router's own frontier beside the confidence rule's)."""
    arms = []
    for mode in modes:
        if mode == "route":
            arms += [Arm(f"route@{t:g}", "triton", {"router_mode": "route", "confidence_threshold": t,
                                                     "learned_router": False}) for t in thresholds]
        elif mode == "router":
            arms.append(Arm("router", "triton", {"router_mode": "route", "learned_router": True}))
            for t in router_thresholds:
                if not 0.0 <= t <= 1.0:
                    raise ValueError(f"--router-thresholds: {t:g} is not a P(disagree) bar in [0, 1]")
                arms.append(Arm(f"router@{t:g}", "triton", {"router_mode": "route", "learned_router": True,
                                                             "router_threshold": t}))
        elif mode == "request":
            arms.append(Arm("request", "triton", {}))
        elif mode not in TRITON_MODES:
            raise ValueError(f"unknown mode {mode!r} in --modes: {', '.join(TRITON_MODES + EXTRA_MODES)}")
        else:
            arms.append(Arm(mode, "triton", {"router_mode": mode}))
    return arms + [Arm(name, "peer") for name in peer_arms]


def run_triton(url: str, arm: Arm, prompt: Prompt, max_tokens: int, rec: RunRecord) -> None:
    from tokenrouter_backend.client.triton_client import generate_grpc

    # every arm runs the same prompt: with the decision cache a later arm would draft an
    # earlier arm's answer, so no arm may use it
    r = generate_grpc(url, prompt.text, stream=True, timeout_s=REQUEST_TIMEOUT_S, max_tokens=max_tokens,
                      answer_cache=False, **arm.knobs)
    s = r.stats
    rec.text, rec.tokens, rec.latency_s, rec.ttft_s = r.text, r.tokens, r.latency_s, r.ttft_s
    rec.tokens_per_s, rec.stats = r.tokens_per_s, s
    rec.light_share = s.get("light_share")
    rec.heavy_calls_per_token = s.get("heavy_calls_per_token")
    rec.mean_accepted = s.get("mean_accepted")
    total = s.get("total_ms") or 0.0
    rec.router_overhead_share = s.get("router_overhead_ms", 0.0) / total if total else None


def run_peer(peers, arm: Arm, prompt: Prompt, max_tokens: int, rec: RunRecord) -> None:
    r = peers.generate(arm.name, prompt.text, max_tokens)
    rec.text, rec.tokens, rec.latency_s, rec.ttft_s = r.text, r.tokens, r.latency_s, r.ttft_s
    rec.tokens_per_s = r.tokens / r.latency_s if r.latency_s > 0 else 0.0
    rec.stats = r.extra


def run_one(arm: Arm, prompt: Prompt, repeat: int, order: int, max_tokens: int, url: str | None,
            peers) -> RunRecord:
    rec = RunRecord(arm.name, prompt.id, prompt.workload, repeat, order)
    try:
        if arm.kind == "triton":
            run_triton(url, arm, prompt, max_tokens, rec)
        else:
            run_peer(peers, arm, prompt, max_tokens, rec)
    except Exception as exc:  # noqa: BLE001 - one failing run must not lose the others; it is reported
        rec.error = f"{type(exc).__name__}: {exc}"[:1000]
    return rec


def warm_up(arms: list[Arm], prompt: Prompt, url: str | None, peers, log) -> None:
    """One short request per arm first: session set-up and lazy allocations are not measured."""
    for arm in arms:
        rec = run_one(arm, prompt, -1, 0, WARMUP_TOKENS, url, peers)
        if rec.error:
            log(f"warm-up {arm.name}: {rec.error}")


def prewarm(url: str | None, prompt: Prompt) -> None:
    """Unrecorded requests put the prompt's KV in both branches' prefix caches, so every
    Triton arm starts from a cached prompt (otherwise the first arm on a prompt would pay
    the prefill the later ones skip; ``arm_prompts.PREWARM_REQUESTS``)."""
    if url is None:
        return
    from tokenrouter_backend.client.triton_client import generate_grpc

    for knobs in PREWARM_REQUESTS:
        generate_grpc(url, prompt.text, stream=True, timeout_s=REQUEST_TIMEOUT_S, **knobs)


def run_interleaved(prompts: list[Prompt], arms: list[Arm], repeats: int, max_tokens: int,
                    url: str | None, peers, log=print, sink: Path | None = None) -> list[RunRecord]:
    """Prompt-major loop; within a prompt the arm order rotates by one per prompt (each prompt
    ``prewarm``-ed first). Each record is also appended to ``sink`` (JSON lines) at once, so a
    cut-short run keeps its data."""
    records = []
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            prewarm(url, prompt)
            shift = (i + rep) % len(arms)
            for order, arm in enumerate(arms[shift:] + arms[:shift]):
                rec = run_one(arm, prompt, rep, order, max_tokens, url, peers)
                records.append(rec)
                if sink is not None:
                    append_record(sink, rec)
                log(f"[{rep}] {prompt.id:28s} {arm.name:18s} " +
                    (f"ERROR {rec.error[:120]}" if rec.error else
                     f"{rec.tokens:4d} tok {rec.latency_s:7.2f}s {rec.tokens_per_s:6.2f} tok/s "
                     f"ttft {rec.ttft_s:5.2f}s light {rec.light_share if rec.light_share is not None else '-'}"))
    return records


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", help="gRPC host:port of a running TokenRouter server")
    p.add_argument("--repo", type=Path, help="model repository: started with TritonServer unless --url; "
                   "also gives the tokenizer and ONNX heavy for scoring")
    p.add_argument("--heavy", help="heavy source (HF folder or GGUF) for the transformers peers")
    p.add_argument("--light", help="light source (HF folder or GGUF) for the transformers peers")
    p.add_argument("--no-peers", action="store_true", help="skip the transformers peers")
    p.add_argument("--peer-arms", default=None, help="comma list of hf_heavy,hf_assisted,hf_prompt_lookup")
    p.add_argument("--modes", default=",".join(TRITON_MODES),
                   help=f"Triton arms, comma list of {', '.join(TRITON_MODES + EXTRA_MODES)} (default: %(default)s)")
    p.add_argument("--thresholds", default=None, help=f"route thresholds (default {DEFAULT_THRESHOLDS})")
    p.add_argument("--router-thresholds", default="",
                   help="with the router mode: also router@T arms at these learned-router bars (P(disagree) in [0, 1])")
    p.add_argument("--workloads", default=",".join(ALL_WORKLOADS),
                   help=f"comma list of {', '.join(ALL_WORKLOADS + CHAT_WORKLOADS)} (default: the first four; "
                   f"{' and '.join(CHAT_WORKLOADS)} are chat prompts rendered by --repo's chat template)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="2 prompts per workload, one route threshold")
    size.add_argument("--full", action="store_true", help="all 164 HumanEval problems")
    p.add_argument("--per-workload", type=int, default=None, help="cap prompts per workload")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--no-nll", action="store_true", help="skip heavy-model NLL scoring")
    p.add_argument("--load-concurrency", default="", help="perf_analyzer sweep, e.g. 1,2,4,8,16 (empty: none)")
    p.add_argument("--load-modes", default="heavy,verify,route")
    p.add_argument("--load-max-tokens", type=int, default=32)
    p.add_argument("--load-window", type=int, default=None, help="requests per perf_analyzer window")
    p.add_argument("--aiperf-url", default="", help="also run the AIPerf chat sweep against this running "
                   "OpenAI front (http://HOST:PORT of `tokenrouter serve --openai-port`)")
    p.add_argument("--aiperf-only", action="store_true", help="only the AIPerf sweep (no single-stream arms)")
    p.add_argument("--aiperf-concurrency", default=",".join(map(str, aiperf_sweep.DEFAULT_CONCURRENCY)))
    p.add_argument("--aiperf-modes", default=",".join(aiperf_sweep.DEFAULT_MODES))
    p.add_argument("--aiperf-per-stream", type=int, default=aiperf_sweep.DEFAULT_PER_STREAM,
                   help="requests per stream at each point (default %(default)s)")
    p.add_argument("--aiperf-slo", default=aiperf_sweep.DEFAULT_SLO,
                   help="goodput SLO, AIPerf --goodput 'KEY:MS ...' (default '%(default)s')")
    p.add_argument("--aiperf-tokenizer", type=Path, default=None,
                   help="tokenizer folder for AIPerf (default: --repo's preprocessing/1/tokenizer)")
    p.add_argument("--out", type=Path, default=Path("bench_out"))


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _thresholds(args) -> list[float]:
    if args.thresholds:
        return [float(t) for t in _csv(args.thresholds)]
    return list(QUICK_THRESHOLDS if args.quick else DEFAULT_THRESHOLDS)


def _load_peers(args, log):
    if args.no_peers or not args.heavy:
        return None
    from .peers import Peers

    t0 = time.perf_counter()
    peers = Peers(args.heavy, args.light)
    log(f"peers loaded in {time.perf_counter() - t0:.0f}s")
    return peers


def _scorer_and_tokenizer(args, peers):
    """Heavy tokenizer for token comparisons and the NLL scorer (transformers if loaded, else ONNX)."""
    from .scoring import load_scoring

    return load_scoring(peers, args.repo, want_nll=not args.no_nll)


def bench_prompts(args, log=print) -> list[Prompt]:
    """The run's prompts: the plain workloads, then the chat ones rendered by --repo's template."""
    names = _csv(args.workloads)
    plain, chat = [n for n in names if n not in CHAT_WORKLOADS], [n for n in names if n in CHAT_WORKLOADS]
    prompts = load_workloads(plain, quick=args.quick, full=args.full, per_workload=args.per_workload) if plain else []
    if chat and args.repo is None:
        raise SystemExit(f"workloads {', '.join(chat)}: their chat prompts need --repo (the chat template)")
    if chat:
        from .traffic import repo_tokenizer

        cap = QUICK_PER_WORKLOAD if args.quick else args.per_workload
        short = short_answer_prompts(chat_renderer(args.repo), tokenizer=repo_tokenizer(args.repo),
                                     rag=SHORT_RAG in chat)
        for name in chat:
            mine = [p for p in short if p.workload == name]
            prompts += mine[:cap] if cap else mine
    return prompts


def chat_renderer(repo: Path):
    """The exported tokenizer's chat template: messages -> prompt text (as the OpenAI front renders)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(Path(repo) / "preprocessing" / "1" / "tokenizer"))
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"workloads {', '.join(CHAT_WORKLOADS)}: {repo}'s tokenizer has no chat template")
    return lambda messages: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def run_aiperf(args, log) -> list[dict]:
    tokenizer = args.aiperf_tokenizer or (args.repo / "preprocessing" / "1" / "tokenizer" if args.repo else None)
    if tokenizer is None:
        raise SystemExit("--aiperf-url: AIPerf needs the tokenizer: give --repo or --aiperf-tokenizer")
    config = aiperf_sweep.SweepConfig(args.aiperf_url, Path(tokenizer), tuple(_csv(args.aiperf_modes)),
                                      tuple(int(c) for c in _csv(args.aiperf_concurrency)), args.aiperf_per_stream,
                                      args.aiperf_slo)
    return aiperf_sweep.sweep(config, args.out / "aiperf", log)


def execute(args, url: str | None, log=print) -> dict:
    if args.aiperf_only:
        if not args.aiperf_url:
            raise SystemExit("--aiperf-only needs --aiperf-url")
        return {"config": {"command": portable_command(sys.argv)}, "aiperf": run_aiperf(args, log)}
    prompts = bench_prompts(args, log)
    peers = _load_peers(args, log)
    peer_arms = tuple(_csv(args.peer_arms)) if (peers and args.peer_arms) else (peers.arms() if peers else ())
    arms = make_arms(_csv(args.modes) if url else [], _thresholds(args), peer_arms,
                     tuple(float(t) for t in _csv(args.router_thresholds)))
    if not arms:
        raise SystemExit("nothing to run: give --url/--repo and/or --heavy")
    log(f"{len(prompts)} prompts x {len(arms)} arms: {', '.join(a.name for a in arms)}")
    warm_up(arms, prompts[0], url, peers, log)
    t0 = time.perf_counter()
    sink = args.out / RECORDS_JSONL
    sink.unlink(missing_ok=True)
    records = run_interleaved(prompts, arms, args.repeats, args.max_tokens, url, peers, log, sink)
    wall = time.perf_counter() - t0
    tokenizer, scorer = _scorer_and_tokenizer(args, peers)
    config = {"max_tokens": args.max_tokens, "repeats": args.repeats, "arms": [asdict(a) for a in arms],
              "workloads": _csv(args.workloads), "prompts": [p.id for p in prompts], "url": url,
              "repo": portable_path(args.repo or None), "heavy": portable_path(args.heavy),
              "light": portable_path(args.light),
              "assistant_schedule": peers.assistant_schedule() if peers else None,
              "nll_scorer": scorer.name if scorer else None, "command": portable_command(sys.argv)}
    results = build_results(config, records, {p.id: p for p in prompts}, tokenizer, scorer, wall)
    if args.load_concurrency and url:
        results["load"] = run_load(args, url, prompts, log)
    if args.aiperf_url:
        results["aiperf"] = run_aiperf(args, log)
    return results


def run_load(args, url: str, prompts: list[Prompt], log) -> list[dict]:
    from . import load

    thresholds = _thresholds(args)
    extra = {"route": {"confidence_threshold": thresholds[len(thresholds) // 2]}}
    return load.sweep(url, prompts, _csv(args.load_modes), [int(c) for c in _csv(args.load_concurrency)],
                      args.load_max_tokens, args.out / "perf", extra,
                      args.load_window or load.WINDOW_REQUESTS, log)


def run(args: argparse.Namespace) -> int:
    unknown = [m for m in _csv(args.modes) if m not in TRITON_MODES + EXTRA_MODES]
    if unknown:
        print(f"tokenrouter bench: unknown --modes {unknown}; choose from {', '.join(TRITON_MODES + EXTRA_MODES)}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.url or not args.repo or args.aiperf_only:  # the AIPerf sweep talks to a running OpenAI front
        results = execute(args, args.url, log)
    else:
        import signal

        from tokenrouter_backend.server.process import TritonServer

        # SIGTERM (kill, timeout) must unwind the with-block so the server and its stubs stop
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        # one admin key for the server and perf_analyzer (which reads the model config)
        os.environ.setdefault(ADMIN_KEY_ENV, secrets.token_urlsafe(32))
        with TritonServer(args.repo, log_path=args.out / "tritonserver.log") as server:
            results = execute(args, server.grpc_url, log)
    report.write_all(results, args.out)
    log(f"wrote {args.out}/results.json, results.md and plots")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouter bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
