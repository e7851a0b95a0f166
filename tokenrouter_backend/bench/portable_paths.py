"""Paths in benchmark results written without the machine they ran on.

A results file is committed and read elsewhere, so the paths it records (``--repo``, the pair,
the command line) are shown relative to where they live: ``<data>/...`` under the data
directory (``$TOKENROUTER_DATA``, default ``~/.cache/tokenrouter``), relative to the current
directory under it, ``~/...`` under the home directory, ``<tmp>/...`` under the temporary
directory, else ``<abs>/<name>`` (only the last component).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tokenrouter_backend.server import paths


def _under(path: Path, root: Path) -> str | None:
    try:
        rel = path.relative_to(root.expanduser().resolve())
    except ValueError:
        return None
    return rel.as_posix() or "."


def portable_path(value: str | os.PathLike | None) -> str | None:
    """``value`` without machine-specific prefixes (see module docstring); None stays None."""
    if value is None:
        return None
    text = str(value)
    if not os.path.isabs(text):
        return text
    path = Path(text).resolve()
    for root, label in ((paths.data_dir(), "<data>"), (Path.cwd(), None),
                        (Path(tempfile.gettempdir()), "<tmp>"), (Path.home(), "~")):
        rel = _under(path, root)
        if rel is not None:
            return rel if label is None else (label if rel == "." else f"{label}/{rel}")
    return f"<abs>/{path.name}"


def portable_command(argv: list[str]) -> str:
    """A command line with every absolute path argument (also ``--opt=/path``) made portable."""
    words = []
    for word in argv:
        opt, eq, rest = word.partition("=")
        if eq and opt.startswith("-") and os.path.isabs(rest):
            words.append(f"{opt}={portable_path(rest)}")
        else:
            words.append(portable_path(word) if os.path.isabs(word) else word)
    return " ".join(words)
