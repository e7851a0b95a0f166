"""Decision logs as a page (``tokenrouter replay LOG --html OUT``): answers coloured by origin.

Each request's answer is rebuilt from its blocks (``output_from`` / ``output`` /
``output_kinds`` of every ``BlockRecord``: a rollback rewrites from ``output_from``). Each
token is a span coloured by ``routing_trace.Kind``; hovering shows what the router knew
when it decided: the light confidence, entropy and margin, the token class, the learned router's
P(disagree) and the heavy verdict. Static HTML + CSS (tooltips from ``data-tip``), no
script: the page reads the same in any browser and in a headless one.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from tokenrouter_backend.core.loop.hooks import BlockRecord
from tokenrouter_backend.core.loop.routing_trace import LABELS, Kind
from tokenrouter_backend.core.signals.token_classes import TokenClass

Decode = Callable[[Sequence[int]], str]
CONTEXT = 6  # tokens of left context when decoding one token's text

STYLE = """
body { font-family: sans-serif; margin: 1.5em; background: #fafafa; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1em; margin: 1.2em 0 .3em; font-family: monospace; }
.answer { font-family: monospace; white-space: pre-wrap; background: #fff; border: 1px solid #ccc;
          padding: .6em; line-height: 1.6; }
.tok { position: relative; border-radius: 2px; }
.k-u { background: #c8f0c8; } .k-v { background: #c8e4f8; } .k-h { background: #fde9b0; }
.k-r { background: #f8b8b8; text-decoration: underline wavy #b00; } .k-c { background: #e4d0f4; }
.tok:hover::after { content: attr(data-tip); position: absolute; left: 0; top: 1.5em; z-index: 9;
                    white-space: pre; background: #333; color: #fff; padding: .3em .5em; font-size: .8em; }
.legend span { padding: .1em .5em; margin-right: .6em; font-family: monospace; }
.meta { color: #666; font-size: .85em; }
"""


@dataclass
class Token:
    id: int
    kind: Kind
    tip: str


def _tip(record: BlockRecord, j: int, kind: Kind) -> str:
    """Hover text of drafted token j of ``record`` (or of the heavy token that followed)."""
    lines = [LABELS[kind], f"block at {record.position} ({record.mode}, {record.action})"]
    if 0 <= j < len(record.drafted):
        light = kind in (Kind.LIGHT_UNCHECKED, Kind.LIGHT_VERIFIED)
        proposed = "" if light else f" (light proposed id {record.drafted[j]})"
        margin = f", margin {record.margin[j]:.3f}" if j < len(record.margin) else ""
        lines.append(f"light confidence {record.confidence[j]:.3f}, entropy {record.entropy[j]:.3f}{margin}{proposed}")
        if j < len(record.token_class):
            lines.append(f"class {TokenClass(record.token_class[j]).key}")
        if j < len(record.router_score):
            lines.append(f"router P(disagree) {record.router_score[j]:.3f}")
        if j < len(record.heavy_agree):
            lines.append("heavy verdict: " + ("agrees" if record.heavy_agree[j] else "disagrees")
                         + (f" (heavy p {record.heavy_prob[j]:.3f})" if j < len(record.heavy_prob) else ""))
        elif kind == Kind.LIGHT_UNCHECKED:
            lines.append("heavy verdict: not checked")
    if kind == Kind.ROLLED_BACK:
        lines.append(f"replaced {record.rolled_back} rolled-back light tokens")
    return "\n".join(lines)


def rebuild(records: Iterable[BlockRecord]) -> dict[str, list[Token]]:
    """request_id -> its final answer as Tokens (records in log order)."""
    answers: dict[str, list[Token]] = {}
    for r in records:
        if r.output_from < 0:
            continue
        answer = answers.setdefault(r.request_id, [])
        old = answer[r.output_from :]
        del answer[r.output_from :]
        for i, (tok, code) in enumerate(zip(r.output, r.output_kinds)):
            kind, j = Kind(code), r.output_from + i - r.position
            if j < 0 and i < len(old) and old[i].id == tok and old[i].kind == kind:
                answer.append(old[i])  # kept through a rollback further on: its own block's details
            else:
                answer.append(Token(tok, kind, _tip(r, j, kind)))
    return answers


def token_texts(ids: Sequence[int], decode: Decode | None) -> list[str]:
    """Each token's text, decoded with a little left context (byte-level BPE merges stay whole)."""
    if decode is None:
        return [f"⟨{t}⟩" for t in ids]
    out = []
    for i in range(len(ids)):
        lo = max(0, i - CONTEXT)
        before, text = decode(ids[lo:i]) if i > lo else "", decode(ids[lo : i + 1])
        out.append(text[len(before):] if text.startswith(before) else text)
    return out


def render(records: Sequence[BlockRecord], decode: Decode | None, title: str = "TokenRouter decisions") -> str:
    answers = rebuild(records)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>", "<div class='legend'>"]
    parts += [f"<span class='k-{k.value}'>{html.escape(LABELS[k])}</span>" for k in Kind]
    parts.append(f"</div><p class='meta'>{len(records)} blocks, {len(answers)} requests</p>")
    for request_id, tokens in answers.items():
        n = len(tokens) or 1
        share = {k: sum(t.kind == k for t in tokens) / n for k in Kind}
        meta = ", ".join(f"{LABELS[k]} {share[k]:.0%}" for k in Kind)
        parts.append(f"<h2>{html.escape(request_id or '(no id)')}</h2><p class='meta'>{len(tokens)} tokens: "
                     f"{meta}</p><div class='answer' data-request='{html.escape(request_id, quote=True)}'>")
        for tok, text in zip(tokens, token_texts([t.id for t in tokens], decode)):
            parts.append(f"<span class='tok k-{tok.kind.value}' data-id='{tok.id}' "
                         f"data-tip='{html.escape(tok.tip, quote=True)}'>{html.escape(text)}</span>")
        parts.append("</div>")
    parts.append("</body></html>")
    return "".join(parts)
