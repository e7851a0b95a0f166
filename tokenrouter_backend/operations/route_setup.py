"""The server's route gate from config.pbtxt: class policy, vocabulary classes, router file.

Parameters (router model, docs/configuration.md): ``critical_<class>`` (``verify`` or a
scale, see ``core/signals/route_gate.py``), ``router_file`` (a learned router JSON file; a relative
path is read from the router's version directory; "" = the plain confidence rule) and
``router_threshold`` (P(disagree) at or below which a draft stands; "" = the file's own).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Mapping, Sequence

from tokenrouter_backend.core.protocol.params import InvalidRequest, config_value
from tokenrouter_backend.core.signals.learned_router import LearnedRouter, RouterFileError
from tokenrouter_backend.core.signals.route_gate import ClassPolicy, RouteGate
from tokenrouter_backend.core.signals.token_classes import VocabClasses


def load_router(parameters: Mapping[str, str], base_dir: Path) -> LearnedRouter | None:
    """The learned router named by ``router_file`` (None when unset), threshold applied."""
    name = str(config_value(parameters, "router_file", str, "")).strip()
    if not name:
        return None
    path = Path(name) if Path(name).is_absolute() else base_dir / name
    try:
        router = LearnedRouter.load(path)
    except RouterFileError as exc:
        raise InvalidRequest(f"config parameter router_file: {exc}") from exc
    threshold = config_value(parameters, "router_threshold", float, math.nan)
    if math.isnan(threshold):
        return router
    if not 0.0 <= threshold <= 1.0:
        raise InvalidRequest(f"config parameter router_threshold must be in [0, 1]; got {threshold}")
    return dataclasses.replace(router, threshold=threshold)


def build_route_gate(parameters: Mapping[str, str], vocab_texts: Sequence[str] | None, base_dir: Path) -> RouteGate:
    """One gate for the server (vocab_texts: each token id's decoded text, or None)."""
    vocab = VocabClasses.from_texts(vocab_texts) if vocab_texts is not None else None
    return RouteGate(ClassPolicy.from_config(parameters), vocab, load_router(parameters, base_dir))


def vocabulary_texts(tokenizer) -> list[str]:
    """Each id's text, from a ``tokenizers.Tokenizer`` (special tokens kept)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
