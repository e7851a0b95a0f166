"""A larger training set for a pair's router: 120 prompts built from short tables.

``router_prompts`` holds the exporter's 20 hand-written prompts (minutes on the demo pair);
this module widens them to 30 of each kind (raw code completions, structured boilerplate,
prose, chat code requests) for retraining a router on more heavy verdicts than the export
collects (``research/studies/router_data_study.py``). Each prompt is written from a table of
subjects, so the set is varied in what it names, not in its forms. Like the exporter's set
it is disjoint from what the benchmarks evaluate: no HumanEval problem and no
``bench.workloads`` prompt is among them (a test checks names and texts).
"""
from __future__ import annotations

from tokenrouter_backend.learning.router_prompts import TrainingPrompt

# (name, signature line(s), docstring): raw completions of a function or class body.
_RAW_CODE = [
    ("clamp", "def clamp(value: float, low: float, high: float) -> float:", "Limit value to the range [low, high]."),
    ("count_vowels", "def count_vowels(text: str) -> int:", "Count the vowels a, e, i, o, u in text, ignoring case."),
    ("rotate_list", "def rotate(items: list, k: int) -> list:", "Rotate items to the right by k positions."),
    ("is_anagram", "def is_anagram(a: str, b: str) -> bool:", "Return True if a and b use the same letters."),
    ("mean_std", "def mean_and_std(values: list[float]) -> tuple[float, float]:",
     "Return the mean and population standard deviation of values."),
    ("camel_to_snake", "def camel_to_snake(name: str) -> str:", "Convert CamelCase to snake_case."),
    ("pairwise_sum", "def pairwise_sums(values: list[int]) -> list[int]:",
     "Return the sums of each pair of neighbouring values."),
    ("group_by_key", "def group_by(records: list[dict], key: str) -> dict:",
     "Group records into lists keyed by record[key]."),
    ("digits_sum", "def digit_sum(n: int) -> int:", "Sum the decimal digits of a non-negative integer."),
    ("invert_dict", "def invert(mapping: dict) -> dict:", "Swap keys and values; later keys win on duplicates."),
    ("safe_div", "def safe_divide(a: float, b: float, default: float = 0.0) -> float:",
     "Divide a by b, returning default when b is zero."),
    ("leap_year", "def is_leap_year(year: int) -> bool:", "Return True for leap years of the Gregorian calendar."),
    ("caesar", "def caesar_shift(text: str, shift: int) -> str:",
     "Shift each ASCII letter by shift places, keeping case; other characters unchanged."),
    ("file_ext", "def extension(path: str) -> str:", "Return the file extension of path without the dot, or ''."),
    ("running_max", "def running_max(values: list[int]) -> list[int]:",
     "Return the maximum seen so far at each index."),
    ("bits_set", "def count_bits(n: int) -> int:", "Count the 1 bits in the binary form of n >= 0."),
    ("title_case", "def title_case(sentence: str) -> str:", "Capitalise the first letter of every word."),
    ("zip_dicts", "def zip_to_dict(keys: list[str], values: list) -> dict:",
     "Build a dict from parallel lists; raise ValueError if their lengths differ."),
    ("nth_prime", "def nth_prime(n: int) -> int:", "Return the n-th prime number, nth_prime(1) == 2."),
    ("matrix_trace", "def trace(matrix: list[list[float]]) -> float:", "Sum of the main diagonal of a square matrix."),
    ("stack_class", "class Stack:", "A last-in first-out stack backed by a list."),
    ("counter_class", "class Counter:", "Counts events by name and reports the most common ones."),
    ("temp_convert", "def celsius_to_fahrenheit(c: float) -> float:", "Convert degrees Celsius to Fahrenheit."),
    ("chunk_string", "def wrap_text(text: str, width: int) -> list[str]:",
     "Split text into lines of at most width characters, breaking at spaces."),
    ("hex_color", "def hex_to_rgb(color: str) -> tuple[int, int, int]:", "Parse '#RRGGBB' into an (r, g, b) tuple."),
    ("trimmed_mean", "def trimmed_mean(values: list[float], cut: int) -> float:",
     "Mean of values after dropping the cut smallest and cut largest."),
    ("unique_chars", "def first_unique(text: str) -> int:",
     "Index of the first character that occurs once in text, or -1."),
    ("interval_merge", "def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:",
     "Merge overlapping closed intervals and return them sorted."),
    ("url_query", "def parse_query(query: str) -> dict[str, str]:", "Parse 'a=1&b=two' into {'a': '1', 'b': 'two'}."),
    ("timer_ctx", "class Timer:", "A context manager that records how long its block took in seconds."),
]

# (name, subject, fields): a JSON list of records the model continues.
_JSON_LISTS = [
    ("json_books", "books", [("title", '"Dune"', '"Emma"'), ("author", '"Frank Herbert"', '"Jane Austen"'),
                             ("year", "1965", "1815")]),
    ("json_cities", "cities", [("name", '"Lyon"', '"Porto"'), ("country", '"France"', '"Portugal"'),
                               ("population", "522000", "232000")]),
    ("json_sensors", "sensors", [("id", '"t-01"', '"t-02"'), ("kind", '"temperature"', '"humidity"'),
                                 ("value", "21.5", "40.2")]),
    ("json_employees", "employees", [("id", "101", "102"), ("name", '"Maria"', '"Kenji"'),
                                     ("team", '"payments"', '"search"')]),
    ("json_planets", "planets", [("name", '"Mercury"', '"Venus"'), ("moons", "0", "0"),
                                 ("au", "0.39", "0.72")]),
    ("json_events", "events", [("type", '"login"', '"logout"'), ("user", '"u42"', '"u42"'),
                               ("ts", '"2024-03-01T10:00:00Z"', '"2024-03-01T10:30:00Z"')]),
    ("json_courses", "courses", [("code", '"CS101"', '"CS102"'), ("title", '"Intro to Programming"',
                                 '"Data Structures"'), ("credits", "4", "4")]),
    ("json_colors", "colors", [("name", '"red"', '"green"'), ("hex", '"#ff0000"', '"#00ff00"')]),
]
_YAML = {
    "yaml_k8s": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  replicas: 3\n"
                "  selector:\n    matchLabels:\n      app: api\n  template:\n",
    "yaml_actions": "name: CI\n\non:\n  push:\n    branches: [main]\n\njobs:\n  test:\n    runs-on: ubuntu-latest\n"
                    "    steps:\n      - uses: actions/checkout@v4\n",
    "yaml_ansible": "- hosts: webservers\n  become: true\n  tasks:\n    - name: install nginx\n      apt:\n"
                    "        name: nginx\n        state: present\n",
    "yaml_openapi": "openapi: 3.0.0\ninfo:\n  title: Pet Store\n  version: 1.0.0\npaths:\n  /pets:\n    get:\n",
}
_SQL = {
    "sql_create": "CREATE TABLE customers (\n    id INTEGER PRIMARY KEY,\n    name TEXT NOT NULL,\n",
    "sql_orders": "INSERT INTO orders (id, customer_id, total) VALUES (1, 7, 19.99);\n"
                  "INSERT INTO orders (id, customer_id, total) VALUES (2, 3, 5.00);\n",
    "sql_select": "-- monthly revenue per region\nSELECT region,\n       date_trunc('month', created_at) AS month,\n",
}
_OTHER_STRUCTURED = {
    "toml_project": '[project]\nname = "weatherkit"\nversion = "0.3.0"\ndependencies = [\n    "httpx>=0.27",\n',
    "csv_rows": "date,city,high,low\n2024-06-01,Oslo,18,9\n2024-06-02,Oslo,20,11\n",
    "ini_app": "[database]\nhost = db.internal\nport = 5432\n\n[cache]\n",
    "xml_feed": '<?xml version="1.0"?>\n<feed>\n  <entry>\n    <title>First post</title>\n',
    "md_table": "| Command | What it does |\n|---|---|\n| `ls` | list files |\n| `cd` | change directory |\n",
    "py_constants": "# HTTP methods and whether they are idempotent\nIDEMPOTENT = {\n    \"GET\": True,\n",
    "py_enum_days": "from enum import Enum\n\n\nclass Weekday(Enum):\n    MONDAY = 1\n",
    "py_dataclass_point": "from dataclasses import dataclass\n\n\n@dataclass\nclass Shipment:\n    tracking_id: str\n",
    "dockerfile": "FROM python:3.12-slim\n\nWORKDIR /app\nCOPY requirements.txt .\n",
    "makefile": ".PHONY: build test clean\n\nbuild:\n\tgo build ./...\n\n",
    "nginx_conf": "server {\n    listen 80;\n    server_name example.org;\n\n",
    "html_form": '<form action="/signup" method="post">\n  <label for="email">Email</label>\n',
    "proto": 'syntax = "proto3";\n\npackage shop;\n\nmessage Product {\n  string id = 1;\n',
    "graphql": "type Query {\n  book(id: ID!): Book\n}\n\ntype Book {\n",
    "css_rules": ".button {\n  padding: 8px 16px;\n  border-radius: 4px;\n}\n\n",
}
_PROSE = {
    "readme_cli": "# tidyup\n\ntidyup is a command-line tool that",
    "readme_lib": "# geohash-lite\n\nA small library for encoding latitude and longitude. It",
    "changelog_fix": "## Changelog\n\n### 0.9.1\n\n- Fixed",
    "commit_cache": "Speed up template rendering\n\nTemplates were",
    "commit_docs": "Document the retry options\n\nThe client",
    "release_mobile": "Release notes, version 5.0\n\nThe app now supports offline mode. When",
    "email_outage": "Hello everyone,\n\nYesterday's outage lasted about 40 minutes. It started when",
    "email_welcome": "Hi Priya,\n\nWelcome to the data team! In your first week you will",
    "comment_parser": "# The parser reads the file line by line and",
    "comment_retry": "# Retries use exponential backoff so that",
    "docstring_resize": ('def resize(image, width: int, height: int, keep_aspect: bool = True):\n'
                         '    """Resize image.\n\n    '),
    "docstring_connect": 'def connect(host: str, port: int = 5432, ssl: bool = False):\n    """',
    "explain_dns": "How DNS works\n\nWhen you type a web address into your browser, the",
    "explain_git": "Understanding git branches\n\nA branch in git is",
    "explain_tcp": "TCP and UDP compared\n\nBoth protocols carry data between programs, but",
    "explain_hash": "Hash tables in one page\n\nA hash table stores",
    "explain_recursion": "Recursion, explained\n\nA function is recursive when",
    "story_lighthouse": "The lighthouse keeper had not seen a ship in three weeks. Each evening he",
    "story_market": "On Saturday mornings the market square filled with",
    "review_phone": "Review: the new phone is lighter than last year's model, and",
    "recipe_soup": "Tomato soup\n\nIngredients:\n- 6 ripe tomatoes\n- 1 onion\n",
    "meeting_notes": "Meeting notes, 12 March\n\nAttendees: Ana, Ben, Chloe\n\n1. Roadmap:",
    "faq_billing": "Frequently asked questions\n\nQ: When am I billed?\nA:",
    "bug_report": "Steps to reproduce:\n1. Open the settings page.\n2.",
    "api_docs": "## Authentication\n\nEvery request must carry an API key in the",
    "blog_intro": "Last month we moved our build system from Jenkins to",
    "abstract": "Abstract. We study the problem of",
    "howto_backup": "## Backing up the database\n\nBefore an upgrade, take a backup:",
    "policy": "Code review guidelines\n\n1. Every change needs",
    "summary_book": "Summary: the novel follows a young engineer who",
}
_CHAT_CODE = [
    ("chat_palette", "Write a Python function `lighten(hex_color, amount)` that lightens a '#RRGGBB' colour "
                     "by mixing it with white."),
    ("chat_csv_sum", "Write a Python function that reads a CSV file and returns the sum of its 'amount' column."),
    ("chat_dedupe_files", "Write a Python script that finds files with identical contents in a directory tree."),
    ("chat_rate_limit", "Write a Python class `RateLimiter(rate, per)` with a method `allow()` that returns "
                        "False once more than `rate` calls happened in the last `per` seconds."),
    ("chat_json_flat", "Write a Python function that flattens a nested dict into dotted keys, e.g. "
                       "{'a': {'b': 1}} -> {'a.b': 1}."),
    ("chat_words", "Write a Python function that returns the ten most frequent words in a text file."),
    ("chat_tree_depth", "Write a Python function that returns the depth of a binary tree whose nodes have "
                        "`left` and `right` attributes."),
    ("chat_validate_email", "Write a Python function that checks whether a string looks like an email address."),
    ("chat_sql_query", "Write a SQL query that returns each customer's total order amount, highest first."),
    ("chat_bash_backup", "Write a bash script that copies a directory into a dated tar.gz archive."),
    ("chat_binary_str", "Write a Python function that converts an integer to its binary string without bin()."),
    ("chat_matrix_rot", "Write a Python function that rotates a square matrix 90 degrees clockwise in place."),
    ("chat_async_fetch", "Write an async Python function that fetches several URLs concurrently with asyncio "
                         "and returns their status codes."),
    ("chat_unit_test", "Write pytest tests for a function `add(a, b)` that adds two numbers."),
    ("chat_linked_list", "Write a Python class for a singly linked list with append, remove and __iter__."),
    ("chat_temperature", "Write a Python function that converts a list of Celsius readings to Fahrenheit and "
                         "returns the maximum."),
    ("chat_cli_args", "Write a Python command-line program that prints the number of lines of each file given."),
    ("chat_cache", "Write a Python decorator that caches a function's results for a given number of seconds."),
    ("chat_roman_parse", "Write a Python function that parses a Roman numeral into an integer."),
    ("chat_prime_sieve", "Write a Python function that returns all primes below n with the sieve of Eratosthenes."),
    ("chat_js_debounce", "Write a JavaScript debounce function."),
    ("chat_regex_dates", "Write a Python function that finds all dates of the form YYYY-MM-DD in a text."),
    ("chat_bank", "Write a Python class `Account` with deposit, withdraw (refusing overdrafts) and balance."),
    ("chat_pascal", "Write a Python function that returns the first n rows of Pascal's triangle."),
    ("chat_http_server", "Write a minimal Python HTTP server that answers every GET with 'ok'."),
    ("chat_merge_dicts", "Write a Python function that deep-merges two dicts."),
    ("chat_shuffle", "Write a Python function that shuffles a list in place with the Fisher-Yates algorithm."),
    ("chat_percentile", "Write a Python function that returns the p-th percentile of a list of numbers."),
    ("chat_word_wrap", "Write a Python function that justifies text to a given width."),
    ("chat_queue_threads", "Write a Python producer/consumer example with threading and queue.Queue."),
]


def _raw_code() -> list[TrainingPrompt]:
    out = []
    for name, signature, doc in _RAW_CODE:
        if signature.startswith("class "):
            text = f'{signature}\n    """{doc}"""\n\n    def __init__(self'
        else:
            text = f'{signature}\n    """{doc}"""\n'
        out.append(TrainingPrompt(f"more_{name}", text))
    return out


def _structured() -> list[TrainingPrompt]:
    out = []
    for name, subject, fields in _JSON_LISTS:
        rows = ["    {" + ", ".join(f'"{key}": {first}' for key, first, _ in fields) + "},",
                "    {" + ", ".join(f'"{key}": {second}' for key, _, second in fields) + "},"]
        out.append(TrainingPrompt(f"more_{name}", f'{{\n  "{subject}": [\n' + "\n".join(rows) + "\n"))
    for table in (_YAML, _SQL, _OTHER_STRUCTURED):
        out += [TrainingPrompt(f"more_{name}", text) for name, text in table.items()]
    return out


def more_training_prompts() -> list[TrainingPrompt]:
    """The 120 prompts: 30 raw code, 30 structured, 30 prose, 30 chat code requests, in that order."""
    out = _raw_code() + _structured()
    out += [TrainingPrompt(f"more_{name}", text) for name, text in _PROSE.items()]
    out += [TrainingPrompt(f"more_{name}", text, chat=True) for name, text in _CHAT_CODE]
    return out
