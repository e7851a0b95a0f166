"""docs/architecture.md is the map of the code as it is: the test holds it to the tree.

Every module of the package is in the table of its folder's section and every module a
table names exists; the layer table says what ``tests/test_layers.py`` enforces; the sizes the
page states are the ones ``tests/test_sizes.py`` and ``tests/test_house.py`` hold.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import test_house
import test_layers
import test_sizes

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PACKAGE_DIR = ROOT / "tokenrouter_backend"
HEADING = re.compile(r"^#{3,4} `([a-z_/]+)/`", re.M)
NAMES = re.compile(r"`([a-z_]+\.py)`")


def sections() -> dict[str, str]:
    """Folder (relative to the package) -> the text of its section, up to the next heading."""
    marks = list(HEADING.finditer(DOC))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else DOC.find("\n## ", m.end())
        out[m.group(1)] = DOC[m.end(): end if end > 0 else len(DOC)]
    return out


def table_modules(text: str) -> set[str]:
    """Module file names in the first column of the section's table."""
    found = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            found |= set(NAMES.findall(line.split("|")[1]))
    return found


def holds_code(path: Path) -> bool:
    """More than a docstring and ``from __future__`` (a package ``__init__`` that does something)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__") for n in body)


def test_every_module_is_on_the_map_and_every_entry_exists():
    wrong = []
    docs = sections()
    for folder in sorted({p.parent for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts}):
        rel = folder.relative_to(PACKAGE_DIR).as_posix()
        if rel == ".":
            continue
        listed = table_modules(docs.get(rel, ""))
        actual = {p.name for p in folder.glob("*.py") if p.name != "__init__.py" or holds_code(p)}
        if rel == "core":
            continue  # core's modules all sit in its sub-folders (tests/test_layers.py)
        wrong += [f"{rel}/{n}: not in docs/architecture.md" for n in sorted(actual - listed)]
        wrong += [f"{rel}/{n}: in docs/architecture.md, not in the package" for n in sorted(listed - actual)]
    assert not wrong, "\n".join(wrong)


def test_the_layer_table_is_the_enforced_one():
    table = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 5 and re.fullmatch(r"`[a-z_]+/`", cells[1]):
            folder = cells[1].strip("`/")
            table[folder] = {n for n in re.findall(r"`([a-z_]+)/`", cells[3]) if n in test_layers.ALLOWED} - {folder}
    assert table == test_layers.ALLOWED


def test_the_sizes_the_page_states_are_held():
    assert f"no module over {test_sizes.MAX_LINES}" in DOC.replace("\n", " ")
    assert f"at most {test_sizes.MAX_STRATEGY_LINES} lines" in DOC.replace("\n", " ")
    assert f"`client/` at most {test_house.CLIENT_MAX_LINES}" in DOC.replace("\n", " ")
    said = re.search(r"`core/loop/block_loop\.py` \(one request's loop, under (\d+) lines\)", DOC)
    assert said, "the page says how long the block loop is"
    lines = len((PACKAGE_DIR / "core" / "loop" / "block_loop.py").read_text(encoding="utf-8").splitlines())
    assert lines < int(said.group(1)), f"block_loop.py has {lines} lines; the page says under {said.group(1)}"
