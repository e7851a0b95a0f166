"""``tokenrouter export --train-router``: a default learned router built for the exported pair.

After the branches are exported, the exporter runs them in process (``branches.local_pair``:
the real block loop over the exported ONNX models) in verify mode on its own training
prompts (``router_prompts``: disjoint from HumanEval and the benchmark workloads), keeps
every block's decision record — the records a served verify request writes to its decision
log, light margins and token classes included — and fits the learned router on them with
``learning.router_training.train`` (the code behind ``tokenrouter train-router``: logistic
regression, a held-out share of the prompts, the P(disagree) bar chosen for the agreement
of the confidence rule at the default threshold).

What it writes into the router's version directory:

  router.json         the router (``router_file`` in config.pbtxt names it)
  router_train.jsonl  the decision records it was trained on: ``tokenrouter train-router``
                      retrains from them (other labels, another split, with your own logs)
  router_report.txt   held-out precision / recall and the frontier against confidence thresholds

Drafting is forced at every position (``draft_confidence_threshold`` 0, a fixed block of
``block_size``) so that unsure light tokens get heavy verdicts too; n-gram drafts, the
decision cache and the light KV window are off (route drafts with the whole context).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tokenrouter_backend.branches.local_pair import LocalPair
from tokenrouter_backend.core.loop.block_loop import GenerationRequest
from tokenrouter_backend.core.loop.hooks import BlockPlan, BlockRecord
from tokenrouter_backend.core.protocol.names import Mode
from tokenrouter_backend.core.protocol.params import RouterDefaults
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.core.signals.token_classes import VocabClasses
from tokenrouter_backend.learning.router_prompts import TrainingPrompt, training_prompts
from tokenrouter_backend.learning.router_training import TrainReport, report_text, train
from tokenrouter_backend.operations.decision_log import record_to_json
from tokenrouter_backend.operations.route_setup import vocabulary_texts

ROUTER_FILE = "router.json"
RECORDS_FILE = "router_train.jsonl"
REPORT_FILE = "router_report.txt"


@dataclass(frozen=True)
class RouterBuildOptions:
    """``--router-tokens`` and the fixed settings of the training run (documented defaults)."""

    max_tokens: int = 48  # new tokens per training prompt (--router-tokens)
    block_size: int = 4  # drafts per verify block
    holdout: float = 0.25  # share of the prompts held out for the report
    seed: int = 0

    def __post_init__(self):
        if not 8 <= self.max_tokens <= 512:
            raise ValueError(f"--router-tokens must be in [8, 512]; got {self.max_tokens}")


@dataclass
class _Collect:
    """Block hooks that keep every record and change nothing."""

    records: list[BlockRecord] = field(default_factory=list)

    def plan(self, params, block: int) -> BlockPlan:
        return BlockPlan(params, block, params.mode)

    def after_block(self, record: BlockRecord) -> None:
        self.records.append(record)


def prompt_ids(tokenizer, prompt: TrainingPrompt) -> list[int]:
    """The prompt's tokens: chat ones through the model's chat template when it has one."""
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = prompt.text
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def vocab_classes(tokenizer_json: Path) -> VocabClasses:
    """Token classes as the served router builds them (the same ``tokenizer.json``, decoded per id)."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    return VocabClasses.from_texts(vocabulary_texts(Tokenizer.from_file(str(tokenizer_json))))


def collect_records(pair: LocalPair, tokenizer, classes: VocabClasses, end_ids: Sequence[int],
                    options: RouterBuildOptions, prompts: Sequence[TrainingPrompt]) -> list[BlockRecord]:
    """Verify-mode decision records of every training prompt, run one after another."""
    params = RouterDefaults().request_params({
        "router_mode": Mode.VERIFY.value, "max_tokens": options.max_tokens, "block_size": options.block_size,
        "block_schedule": "fixed", "draft_confidence_threshold": 0.0, "ngram_drafts": False,
        "answer_cache": False, "light_kv_window": 0})
    gate = RouteGate(ClassPolicy(), classes)
    eos = tokenizer.eos_token_id
    stops = tuple((int(i),) for i in end_ids if i != eos)
    hooks = _Collect()
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(tuple(prompt_ids(tokenizer, prompt)), params, end_id=eos,
                                    stop_sequences=stops, route_gate=gate)
        asyncio.run(pair.run(request, session_id=i + 1, hooks=hooks, request_id=f"export/{prompt.name}"))
    return hooks.records


def build_router(work: Path, tokenizer, tokenizer_json: Path, end_ids: Sequence[int], out_dir: Path,
                 device: str = "cpu", threads: int = 0,
                 options: RouterBuildOptions = RouterBuildOptions()) -> TrainReport:
    """Run the exported ONNX branches in ``work`` (``work/heavy``, ``work/light``) on the
    training prompts, train, and write the three files into ``out_dir`` (the router's
    version directory). ``tokenizer``: the pair's transformers tokenizer (prompts, chat
    template); ``end_ids``: the tokens that end a document besides eos."""
    from tokenrouter_backend.engine.onnx_lm import OnnxCausalLM  # noqa: PLC0415 (onnxruntime on demand)

    t0 = time.perf_counter()
    pair = LocalPair.of(OnnxCausalLM(work / "light", device=device, intra_op_threads=threads),
                        OnnxCausalLM(work / "heavy", device=device, intra_op_threads=threads))
    prompts = training_prompts()
    records = collect_records(pair, tokenizer, vocab_classes(tokenizer_json), end_ids, options, prompts)
    report = train(records, ClassPolicy(), RouterDefaults.confidence_threshold, holdout=options.holdout,
                   seed=options.seed)
    report.router.trained.update({
        "source": "tokenrouter export --train-router", "prompts": len(prompts),
        "prompt_set": "learning/router_prompts.py", "max_tokens": options.max_tokens,
        "block_size": options.block_size, "build_s": round(time.perf_counter() - t0, 1)})
    out_dir.mkdir(parents=True, exist_ok=True)
    report.router.save(out_dir / ROUTER_FILE)
    with open(out_dir / RECORDS_FILE, "w", encoding="utf-8") as f:
        f.writelines(record_to_json(r) + "\n" for r in records)
    (out_dir / REPORT_FILE).write_text(
        f"tokenrouter export --train-router: {len(prompts)} prompts x {options.max_tokens} tokens, verify, "
        f"block {options.block_size}\n" + report_text(report) + "\n", encoding="utf-8")
    return report
