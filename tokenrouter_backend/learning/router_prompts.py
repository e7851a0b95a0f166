"""The prompts ``tokenrouter export --train-router`` generates its training logs on.

Written for this purpose and disjoint from what the benchmarks evaluate (the HumanEval
problems and the ``bench.workloads`` prompts): code completions (a signature and a
docstring, in the raw completion form), code asked for in a chat (rendered with the
model's chat template when it has one), structured boilerplate and prose. Each is a
``TrainingPrompt``; ``chat`` ones are an instruction for the user turn.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingPrompt:
    name: str
    text: str
    chat: bool = False  # an instruction for the chat template's user turn (raw text without a template)


RAW_CODE = {
    "rle": 'def run_length_encode(text: str) -> list[tuple[str, int]]:\n'
           '    """Return (character, count) pairs for each run of equal characters."""\n',
    "transpose": 'def transpose(matrix: list[list[int]]) -> list[list[int]]:\n'
                 '    """Return the transpose of a rectangular matrix."""\n',
    "slugify": 'import re\n\n\ndef slugify(title: str) -> str:\n'
               '    """Lower-case title, replace runs of non-alphanumerics by one dash, strip dashes."""\n',
    "moving_avg": 'def moving_average(values: list[float], window: int) -> list[float]:\n'
                  '    """Return the mean of each full window of consecutive values."""\n',
    "roman": 'def to_roman(n: int) -> str:\n    """Convert 1 <= n <= 3999 to a Roman numeral."""\n',
    "queue_class": 'class BoundedQueue:\n    """A FIFO queue that drops the oldest item when full."""\n\n'
                   '    def __init__(self, capacity: int):\n',
    "dedupe": 'def dedupe(items: list) -> list:\n'
              '    """Remove duplicates from items, keeping the first occurrence order."""\n',
    "gcd": 'def gcd_all(numbers: list[int]) -> int:\n'
           '    """Greatest common divisor of all numbers (0 for an empty list)."""\n',
}
CHAT_CODE = {
    "chat_histogram": "Write a Python function `histogram(words)` that returns a dict mapping each word length "
                      "to the number of words of that length.",
    "chat_retry": "Write a Python decorator `retry(times)` that calls the wrapped function again when it raises, "
                  "at most `times` times, and re-raises the last error.",
    "chat_matrix": "Write a Python function that multiplies two matrices given as lists of lists, and raises "
                   "ValueError when their shapes do not match.",
    "chat_parse": "Write a Python function `parse_duration(text)` that turns strings like '1h30m' or '45s' "
                  "into a number of seconds.",
}
STRUCTURED = {
    "json_inventory": '{\n  "warehouse": "north",\n  "items": [\n    {"sku": "A-100", "qty": 12, "bin": "R1"},\n'
                      '    {"sku": "A-101", "qty": 4, "bin": "R1"},\n',
    "yaml_service": "services:\n  web:\n    image: nginx:1.27\n    ports:\n      - \"8080:80\"\n  worker:\n",
    "typed_dict": "from typing import TypedDict\n\n\nclass Invoice(TypedDict):\n    number: str\n",
    "html_table": "<table>\n  <tr><th>Country</th><th>Capital</th></tr>\n  <tr><td>France</td><td>Paris</td></tr>\n",
}
PROSE = {
    "release_note": "Release notes, version 3.4\n\nThis release focuses on startup time. The loader now",
    "docstring_retry": 'def download(url: str, attempts: int = 5) -> bytes:\n    """Download url.\n\n    ',
    "howto": "## Installing from source\n\nTo build the project you need a C compiler and",
    "email": "Hi team,\n\nQuick update on the migration: the database move finished last night, and",
}


def training_prompts() -> list[TrainingPrompt]:
    """Every training prompt, in a fixed order."""
    out = [TrainingPrompt(k, v) for k, v in RAW_CODE.items()]
    out += [TrainingPrompt(k, v, chat=True) for k, v in CHAT_CODE.items()]
    out += [TrainingPrompt(k, v) for table in (STRUCTURED, PROSE) for k, v in table.items()]
    return out
