"""The repository speaks of the project only: every tracked text file (``git ls-files``) is free
of absolute paths of the machine it was written on, of links leaving the repository, and of
words about how the work was organised.

Absolute paths. Forbidden: home directories (``/root``, ``/home/...``, ``/Users/...``), checkout
and scratch roots (``/work``, ``/mnt``, ``/srv``, ``/scratch``), any fixed temporary directory
(``/tmp/<name>``, ``/var/tmp/<name>``), and ``/opt/<x>`` except the paths the Docker image
defines (below). Allowed, because they are the same on every machine: kernel and device files
(``/proc``, ``/dev``, ``/sys``), system programs (``/usr/bin/env`` shebangs, ``/bin/...``,
``/etc/...``), URL paths (``/v2/health/ready``, ``/generate``), and inside the Docker image
``/opt/tokenrouter`` (the Dockerfile's WORKDIR), ``/home/tokenrouter`` (its serving user's
home, which the Helm chart mounts writable) and ``/opt/nvidia`` (the NGC base image's
entrypoint). Paths the project itself chooses are written relative to the repository, the
data directory (``$TOKENROUTER_DATA``, ``~/.cache/tokenrouter``, ``<data>/...`` in results)
or ``<tmp>/...``.

Links. A markdown link ``[text](target)`` that is not a URL or an anchor must name a file
inside the repository that exists; every ``something.md`` named in any text must exist (so no
pointer to a note kept elsewhere), except the names of files the tools generate.

This file holds the forbidden patterns themselves, so it is not scanned.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# a path starts a token: at the line start or after a space, quote, bracket, '=' , ':' or ','
_START = r"(?:(?<=^)|(?<=[\s\"'`(\[=:,]))"
_OPT_ALLOWED = ("tokenrouter", "nvidia")
FORBIDDEN_PATH = re.compile(
    _START + r"(?:/(?:root|work|mnt|srv|scratch)(?=[/\s\"'`),:]|$)"
    r"|/(?:home|Users)/(?!tokenrouter\b)\w"
    r"|/(?:var/)?tmp/[\w.-]"
    r"|/opt/(?!(?:" + "|".join(_OPT_ALLOWED) + r")\b)\w)",
    re.MULTILINE)

ORGANISATION_WORDS = re.compile(
    r"\b(?:lent|neighbou?r'?s? (?:job|load|work)|teammates?|the team|our team|device tool|device time"
    r"|this session|(?:another|other) sessions?'?s? (?:job|load|work)|shared (?:box|machine|host)"
    r"|cannot be carried|the brief)\b"
    r"|\.\./shared|\bDESIGN\.md\b",
    re.IGNORECASE)

MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MD_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# written into --out by `tokenrouter bench` and the load sweep
GENERATED_MD = {"results.md", "OUT/results.md", "load.md", "OUT/load.md"}


def tracked_text_files() -> dict[str, str]:
    """Path -> text of every tracked file that is UTF-8 text (binary files are skipped)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    texts = {}
    for name in out.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or name == SELF or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def _hits(pattern: re.Pattern, texts: dict[str, str]) -> list[str]:
    hits = []
    for name, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                hits.append(f"{name}:{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return hits


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    found = tracked_text_files()
    assert len(found) > 50 and "README.md" in found, "git ls-files found too few text files"
    return found


def test_patterns_catch_what_they_should():
    bad = ["cd /work/main", '"/root/.cache/x"', "--repo /tmp/bench_repo", "PY=/home/u/.venv",
           "/opt/torch/.venv/bin/python3", "(/Users/me/x)", "x=/srv/data", "/var/tmp/foo"]
    good = ["/proc/cpuinfo", "#!/usr/bin/env bash", "GET /v2/health/ready", "~/.cache/tokenrouter",
            "/opt/nvidia/nvidia_entrypoint.sh", "WORKDIR /opt/tokenrouter", "docs/work/x",
            "https://example.org/home/x", "<tmp>/bench_tiny", "/dev/null", "$TMPDIR/x"]
    assert [s for s in bad if not FORBIDDEN_PATH.search(s)] == []
    assert [s for s in good if FORBIDDEN_PATH.search(s)] == []
    assert ORGANISATION_WORDS.search("on the lent H200") and ORGANISATION_WORDS.search("a neighbour's job")
    assert not ORGANISATION_WORDS.search("excellent, silent; the KV session of a request")


def test_no_machine_absolute_paths(texts):
    hits = _hits(FORBIDDEN_PATH, texts)
    assert not hits, "absolute machine paths in tracked files:\n" + "\n".join(hits)


def test_no_words_about_how_the_work_was_organised(texts):
    hits = _hits(ORGANISATION_WORDS, texts)
    assert not hits, "words about how the work was organised:\n" + "\n".join(hits)


def _inside(target: Path) -> bool:
    try:
        target.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return True


def test_markdown_links_stay_in_the_repository(texts):
    bad = []
    for name, text in texts.items():
        if not name.endswith(".md"):
            continue
        for link in MD_LINK.findall(text):
            if re.match(r"[a-z][a-z+.-]*:", link) or link.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor on the same page
            target = (ROOT / name).parent / link.split("#", 1)[0]
            if not _inside(target) or not target.exists():
                bad.append(f"{name}: ({link})")
    assert not bad, "links to files that are not in the repository:\n" + "\n".join(bad)


def test_named_markdown_files_exist(texts):
    bad = []
    for name, text in texts.items():
        here = (ROOT / name).parent
        for ref in set(MD_NAME.findall(text)) - GENERATED_MD:
            if not any(_inside(base / ref) and (base / ref).exists()
                       for base in (ROOT, here, ROOT / "docs")):
                bad.append(f"{name}: {ref}")
    assert not bad, "names of markdown files that are not in the repository:\n" + "\n".join(bad)
