"""Prompts of one benchmark arm, kept out of the other arms' caches.

The server reuses work across requests: the prefix KV cache shares the KV of a repeated
prompt's 32-token blocks, and the decision cache drafts an earlier answer to the exact
same prompt. A benchmark that sends one prompt to heavy, then verify, then route would
hand the later arms the earlier arm's prefill (a long retrieved context prefilled once)
or its whole answer. ``for_arm`` starts each prompt with a short comment line naming a
nonce of the arm: the hash chain of the prefix cache differs from the first block on, and
no prompt repeats across arms, while every arm keeps the same text after that line and
the same length (the nonce has a fixed width). Requests also say ``answer_cache: false``
(``NO_REUSE_KNOBS``).

The opposite case, every arm on the same prompt (HumanEval: a different prompt would change
heavy's own answer), is made fair the other way round: before the arms, ``PREWARM_REQUESTS``
put the prompt's KV in both branches' prefix caches, so no arm pays a prefill another
skips. One request per branch, each branch alone: a verify request would not do it, since
the cost model keeps the light model out of a 2-token answer."""
from __future__ import annotations

import hashlib

NO_REUSE_KNOBS = {"answer_cache": False}
PREWARM_REQUESTS = ({"router_mode": "heavy", "max_tokens": 2, **NO_REUSE_KNOBS},
                    {"router_mode": "light", "max_tokens": 2, **NO_REUSE_KNOBS})


def nonce(*parts: object) -> str:
    """Eight hex digits naming an arm (mode, round, ...): equal parts, equal nonce."""
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=4).hexdigest()


def for_arm(text: str, *arm: object) -> str:
    """``text`` as the arm named by ``arm`` sends it (see the module docstring)."""
    return f"# run {nonce(*arm)}\n{text}"
