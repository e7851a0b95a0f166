"""The program a chat answer's code block holds, sanitized as evalplus does before it runs.

A chat model's code block often goes on after the function: example calls, ``assert`` lines
of its own (sometimes wrong), a ``print`` cut off by ``max_tokens``. evalplus scores only the
definitions the entry point needs, so this does the same:

1. the longest run of consecutive lines that parses (the most non-blank lines), which drops a
   statement cut off at the end;
2. of its top-level statements, the imports, and the classes, functions that return something,
   and plain assignments (the first definition of each name);
3. of those definitions, the ones the entry point reaches through the names it uses.

If nothing is left (no definition at all), the parsed run itself. evalplus does this with
tree-sitter; the standard library's ``ast`` reads the same Python, without the dependency tree
the ``evalplus`` package brings (API clients, ``datasets``).
"""
from __future__ import annotations

import ast
from collections import deque


def longest_parsing_span(text: str) -> str:
    """The consecutive lines of ``text`` that parse as Python and hold the most non-blank lines."""
    lines = text.split("\n")
    best, best_count = (0, 0), 0
    for i in range(len(lines)):
        for j in range(len(lines), i, -1):
            count = sum(1 for line in lines[i:j] if line.strip())
            if count <= best_count:
                break  # shorter spans from i hold no more lines
            if _parses("\n".join(lines[i:j])):
                best, best_count = (i, j), count
                break
    return "\n".join(lines[best[0]:best[1]])


def sanitize(code: str, entry_point: str | None = None) -> str:
    """The imports and the definitions ``entry_point`` needs, from the longest parsing span."""
    span = longest_parsing_span(code)
    if not span.strip():
        return span
    tree = ast.parse(span)
    lines = span.split("\n")
    imports, definitions = [], {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
            continue
        name = _defined_name(node)
        if name is not None and name not in definitions:
            definitions[name] = node
    if entry_point is not None:
        reached = _reachable(entry_point, {name: _names_used(node) for name, node in definitions.items()})
        definitions = {name: node for name, node in definitions.items() if name in reached}
    if not definitions:
        return span
    return "\n".join(_source(lines, node) for node in imports + list(definitions.values())).strip()


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a null byte
        return False
    return True


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.ClassDef):
        return node.name
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name if any(isinstance(n, ast.Return) for n in ast.walk(node)) else None
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _reachable(entry_point: str, uses: dict[str, set[str]]) -> set[str]:
    seen, queue = {entry_point}, deque([entry_point])
    while queue:
        for name in uses.get(queue.popleft(), ()):
            if name not in seen:
                seen.add(name)
                queue.append(name)
    return seen


def _source(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1:node.end_lineno])
