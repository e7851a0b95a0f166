"""The library's layers are folders, and imports only go downward (docs/architecture.md).

Every import in ``tokenrouter_backend`` — module level and lazy (inside functions) alike — is
read with ``ast``; a layer may import only the layers listed for it below, ``core/`` imports
no framework, only ``serving/`` touches Triton's ``pb_utils`` (imports it, or names it at
all: what the layers below need from it comes in as plain callables), and no two modules
import each other in a cycle, however long.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "tokenrouter_backend"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# layer -> the layers it may import (besides itself and the package root's __version__)
ALLOWED = {
    "core": set(),
    "engine": {"core"},
    "branches": {"core", "engine"},
    "operations": {"core"},
    "learning": {"core"},
    "serving": {"core", "engine", "branches", "operations"},
    "server": set(),
    "export": {"core", "engine", "branches", "operations", "learning", "server"},
    "client": {"core"},
    "openai_front": {"core", "client"},
    "bench": {"core", "engine", "server", "client", "learning"},
    "cli": {"core", "engine", "branches", "operations", "learning", "serving", "server", "export", "client",
            "openai_front", "bench"},
}
# core/ by purpose: sub-folder -> the core sub-folders it may import (the same rule, one level down)
CORE_ALLOWED = {
    "protocol": set(),  # the branch contract, names, a request's parameters
    "text": {"protocol"},  # detokenization, stop rules on tokens and on text
    "signals": {"protocol"},  # route gate, learned router, token classes, prompt signals, cost curves
    "loop": {"protocol", "text", "signals"},  # the decode loop and its strategies
}
ROOT_MODULES = {"__init__", "__main__"}  # the package itself: its version and `python -m`
FRAMEWORKS = ("tritonclient", "triton_python_backend_utils", "onnxruntime", "torch",
              "transformers", "grpc", "tokenizers", "onnx")
PB_UTILS = "triton_python_backend_utils"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, text: str | None = None) -> list[str]:
    """Absolute names of everything ``path`` (or ``text`` read as if at ``path``) imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append(base)
            # `from pkg import module` imports a module too
            found += [f"{base}.{alias.name}" for alias in node.names
                      if _module_path(f"{base}.{alias.name}") is not None]
    return found


def _module_path(name: str) -> Path | None:
    if not name.startswith(PACKAGE):
        return None
    rel = Path(*name.split("."))
    for candidate in (PACKAGE_DIR.parent / rel.with_suffix(".py"), PACKAGE_DIR.parent / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def layer_of(name: str) -> str | None:
    """The layer folder of a module name; None for the package root."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def sources() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    edges = {}
    for path in sources():
        targets = {t for t in imported_modules(path) if _module_path(t) is not None}
        edges[module_name(path)] = {module_name(_module_path(t)) for t in targets} - {module_name(path)}
    return edges


def test_every_module_sits_in_a_layer_folder():
    loose = [p.name for p in PACKAGE_DIR.glob("*.py") if p.stem not in ROOT_MODULES]
    assert not loose, f"modules outside the layer folders: {loose}"
    folders = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ALLOWED), f"layer folders {sorted(folders)} != {sorted(ALLOWED)}"


def test_layers_import_only_downward():
    wrong = []
    for source, targets in graph().items():
        here = layer_of(source)
        if here is None:
            continue
        for target in targets:
            there = layer_of(target)
            if there is None:
                if target != PACKAGE:
                    wrong.append(f"{source} -> {target}")
            elif there != here and there not in ALLOWED[here]:
                wrong.append(f"{source} ({here}) -> {target} ({there})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def core_part(name: str) -> str | None:
    """The core sub-folder of a module name; None outside core/ (or core's own __init__)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "core" else None


def test_every_core_module_sits_in_a_purpose_folder():
    loose = [p.name for p in (PACKAGE_DIR / "core").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"core modules outside core's sub-folders: {loose}"
    folders = {p.name for p in (PACKAGE_DIR / "core").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(CORE_ALLOWED), f"core sub-folders {sorted(folders)} != {sorted(CORE_ALLOWED)}"


def test_core_parts_import_only_downward():
    wrong = []
    for source, targets in graph().items():
        here = core_part(source)
        if here is None:
            continue
        for target in targets:
            there = core_part(target)
            if there is not None and there != here and there not in CORE_ALLOWED[here]:
                wrong.append(f"{source} (core/{here}) -> {target} (core/{there})")
    assert not wrong, "imports against core's order:\n" + "\n".join(sorted(wrong))


def test_core_imports_no_framework_and_only_serving_touches_pb_utils():
    wrong = []
    for path in sources():
        layer = layer_of(module_name(path))
        for target in imported_modules(path):
            top = target.split(".")[0]
            if layer == "core" and top in FRAMEWORKS:
                wrong.append(f"{module_name(path)} -> {target} (core imports no framework)")
            if top == PB_UTILS and layer != "serving":
                wrong.append(f"{module_name(path)} -> {target} (only serving/ touches pb_utils)")
    assert not wrong, "\n".join(wrong)


BACKEND_UTILS_NAMES = {"pb_utils", "pb"}  # how the glue names the Python backend's utilities


def backend_utils_names(text: str) -> list[str]:
    """Where ``text`` names the backend utilities: the word ``pb_utils`` anywhere (docstrings
    and comments too), or ``pb`` as a parameter, variable, attribute, keyword or import alias."""
    found = [f"line {n}: pb_utils" for n, line in enumerate(text.splitlines(), 1) if "pb_utils" in line]
    for node in ast.walk(ast.parse(text)):
        name = {ast.arg: "arg", ast.Name: "id", ast.Attribute: "attr", ast.keyword: "arg", ast.alias: "asname",
                ast.FunctionDef: "name", ast.AsyncFunctionDef: "name", ast.ClassDef: "name"}.get(type(node))
        if name is not None and getattr(node, name) == "pb":
            found.append(f"line {getattr(node, 'lineno', '?')}: pb")
    return found


def test_only_serving_names_the_backend_utils():
    wrong = []
    for path in sources():
        if layer_of(module_name(path)) != "serving":
            wrong += [f"{module_name(path)} {where}" for where in backend_utils_names(path.read_text())]
    assert not wrong, "only serving/ names Triton's backend utilities:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize("source", [
    "def f(pb_utils):\n    pass", "def f(pb):\n    pass", "x = self.pb.Tensor", "pb = make()", "f(pb=1)",
    "import numpy as pb", '"""Needs pb_utils."""', "x = 1  # pb_utils",
])
def test_the_backend_utils_check_sees_every_spelling(source):
    assert backend_utils_names(source)


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("source, expected", [
    ("from tokenrouter_backend.server import paths", "tokenrouter_backend.server.paths"),
    ("from .. import core", "tokenrouter_backend.core"),
    ("from . import local_pair", "tokenrouter_backend.branches.local_pair"),
    ("def f():\n    from ..engine.kv_store import KVStore", "tokenrouter_backend.engine.kv_store"),
])
def test_the_reader_sees_relative_package_and_lazy_imports(source, expected):
    assert expected in imported_modules(PACKAGE_DIR / "branches" / "in_process.py", source)
