"""The demo pair (Qwen2.5-Coder 1.5B heavy / 0.5B light) through a real tritonserver.

Marked ``real``: deselected by default (needs `tokenrouter models fetch-demo` and the exported
demo repository, minutes to load on 2 cores). Run: `.venv/bin/python -m pytest -m real`.
"""
from __future__ import annotations

import pytest

from support.serving_helpers import router_tokens
from tokenrouter_backend.server import paths

pytestmark = [pytest.mark.real, pytest.mark.triton]

CODE_PROMPTS = [
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards."""\n',
    "import json\n\ndef load_config(path):\n    \"\"\"Read a JSON config file and return a dict.\"\"\"\n",
]


@pytest.fixture(scope="module")
def demo_server(start_triton_module):
    repo = paths.demo_repository()
    if not (repo / "heavy" / "1" / "model.json").is_file():
        pytest.fail(f"no exported demo repository at {repo}: run `make demo` (or fetch-demo + export) first")
    return start_triton_module(repo, ready_timeout_s=900)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(paths.demo_repository() / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def test_verify_equals_heavy_on_demo_pair(demo_server, tokenizer):
    for prompt in CODE_PROMPTS:
        ids = tokenizer.encode(prompt).ids
        heavy, _ = router_tokens(demo_server.grpc_url, ids, router_mode="heavy", max_tokens=32)
        verify, stats = router_tokens(demo_server.grpc_url, ids, router_mode="verify", max_tokens=32)
        assert verify == heavy, prompt
        assert stats["drafts_accepted"] > 0
