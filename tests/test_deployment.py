"""Deployment files: docker-compose.yml per profile (hardening included), the Dockerfile (the
Triton release against NVIDIA's bulletins, the digest pin), the lock files, the image
requirements (Python 3.12 of the Triton 26.09 image), the container scripts, and Python 3.10
compatibility of the sources.

No Docker engine is needed: the compose file is parsed by the compose CLI (`docker-compose
config`, Debian package `docker-compose`), the requirements are resolved by pip for Python
3.12 and 3.10 against PyPI (network to the registry is required, as in CI).
"""
from __future__ import annotations

import ast
import http.server
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROFILES = {  # profile -> services it must start
    "gpu": {"export", "triton"},
    "cpu": {"export-cpu", "triton-cpu"},
    "split": {"export", "heavy", "router"},
}
SERVERS = {"triton", "triton-cpu", "heavy", "router"}
GPU_SERVICES = {"export", "triton", "heavy", "router"}
TRITON_PORTS = {8000, 8001, 8002}
PIP_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64"]
SOURCE_DIRS = ["tokenrouter_backend", "model_repository", "docker", "tests", "scripts"]
# stdlib names that exist only from Python 3.11 on (the Triton image's Python is 3.10)
PY311_ONLY = [r"\bimport tomllib\b", r"\basyncio\.TaskGroup\b", r"\basyncio\.timeout\(",
              r"\bdatetime\.UTC\b", r"\bStrEnum\b", r"from typing import .*\bSelf\b",
              r"\bExceptionGroup\b", r"\bexcept\s*\*"]


# ---- compose ------------------------------------------------------------------------------
def compose_cli() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("no compose CLI: install Debian's `docker-compose` package "
                "(apt-get install -y docker-compose) to validate docker-compose.yml")


def compose_config(profile: str, env: dict | None = None) -> dict:
    cmd = compose_cli() + ["-f", str(COMPOSE_FILE), "--profile", profile, "config"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module", params=sorted(PROFILES))
def profile(request):
    return request.param, compose_config(request.param)


def ports(service: dict) -> list[dict]:
    """Published ports as {host_ip, published, target}: compose v1 prints the short form
    ("127.0.0.1:8000:8000/tcp") when a host address is given, v2 the long one."""
    out = []
    for p in service["ports"]:
        if isinstance(p, dict):
            out.append({"host_ip": p.get("host_ip", ""), "published": int(p["published"]),
                        "target": int(p["target"])})
            continue
        fields = p.split("/")[0].split(":")
        host_ip = fields[0] if len(fields) == 3 else ""
        out.append({"host_ip": host_ip, "published": int(fields[-2]), "target": int(fields[-1])})
    return out


def in_profile(config: dict, name: str) -> dict:
    """Services of the resolved config that `--profile name` starts."""
    return {s: d for s, d in config["services"].items() if name in d.get("profiles", [])}


def test_each_profile_parses_and_starts_its_services(profile):
    name, config = profile
    assert set(in_profile(config, name)) == PROFILES[name]
    # every service is in some profile: a bare `up` starts nothing by surprise
    assert all(d.get("profiles") for d in config["services"].values())


def test_servers_have_ports_healthcheck_shm_ulimits_restart(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        if svc not in SERVERS:
            continue
        assert {p["target"] for p in ports(d)} == TRITON_PORTS, svc
        assert d["healthcheck"]["test"][-1] == "/opt/tokenrouter/docker/healthcheck.py", svc
        assert d["shm_size"] and d["restart"] == "unless-stopped", svc
        assert d["ulimits"]["memlock"] == -1 and int(d["ulimits"]["stack"]) >= 64 << 20, svc
        args = d["entrypoint"] + d["command"]
        assert args[:2] == ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/tritonserver.sh"], svc
        assert "--model-repository=/models" in args, svc
        assert any(a.startswith("--backend-config=python,shm-default-byte-size=") for a in args)
        assert d["image"].startswith("tokenrouter-serve:") and d["build"]["target"] == "serve"


def test_servers_run_the_stub_watchdog_and_get_time_for_a_graceful_stop(profile):
    from tokenrouter_backend.server.stub_watch import STOP_EXTRA_GRACE_S

    name, config = profile
    servers = {s: d for s, d in in_profile(config, name).items() if s in SERVERS}
    assert servers
    for svc, d in servers.items():
        assert d["environment"]["TOKENROUTER_STUB_WATCH"] == "1", svc
        assert d["environment"]["TOKENROUTER_STUB_WATCH_POLL_S"] == "2", svc
        exit_timeout = int(next(a for a in d["entrypoint"] + d["command"]
                                if a.startswith("--exit-timeout-secs=")).split("=")[1])
        grace = d["stop_grace_period"]
        assert grace.endswith("s") and int(grace[:-1]) >= exit_timeout + STOP_EXTRA_GRACE_S, svc
    off = in_profile(compose_config(name, {"TOKENROUTER_STUB_WATCH": "0", "TOKENROUTER_STUB_WATCH_POLL_S": "5"}), name)
    for svc in servers:
        env = off[svc]["environment"]
        assert (env["TOKENROUTER_STUB_WATCH"], env["TOKENROUTER_STUB_WATCH_POLL_S"]) == ("0", "5"), svc


def test_gpu_reservation_exactly_where_a_gpu_is_used(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        devices = d.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        if svc in GPU_SERVICES:
            assert devices and devices[0]["driver"] == "nvidia", svc
            assert "gpu" in devices[0]["capabilities"], svc
        else:
            assert not devices, f"{svc} (cpu profile) must not reserve a GPU"


def test_exports_run_once_before_the_servers(profile):
    name, config = profile
    services = in_profile(config, name)
    export = "export-cpu" if name == "cpu" else "export"
    assert services[export]["restart"] == "no"
    assert services[export]["environment"]["DEVICE"] == ("cpu" if name == "cpu" else "cuda")
    assert any(v.endswith(":/sources:ro") for v in services[export]["volumes"])
    for svc in PROFILES[name] & SERVERS:
        cond = services[svc]["depends_on"][export]["condition"]
        assert cond == "service_completed_successfully", svc


def test_split_profile_router_reaches_heavy_over_grpc():
    services = in_profile(compose_config("split"), "split")
    heavy, router = services["heavy"]["command"], services["router"]["command"]
    assert "--model-control-mode=explicit" in heavy and "--model-control-mode=explicit" in router
    assert [a for a in heavy if a.startswith("--load-model=")] == ["--load-model=heavy"]
    loaded = {a.split("=", 1)[1] for a in router if a.startswith("--load-model=")}
    assert loaded == {"tokenrouter", "preprocessing", "router", "light", "postprocessing"}
    assert services["router"]["environment"]["TOKENROUTER_HEAVY_URL"] == "heavy:8001"
    assert services["router"]["depends_on"]["heavy"]["condition"] == "service_healthy"


def test_heavy_pool_profile_adds_a_second_heavy_server_the_router_can_list():
    from tokenrouter_backend.branches.heavy_pool import parse_heavy_urls

    cmd = compose_cli() + ["-f", str(COMPOSE_FILE), "--profile", "split", "--profile", "heavy-pool", "config"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "TOKENROUTER_HEAVY_URL": "heavy:8001,heavy-2:8001"})
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    heavy, second = services["heavy"], services["heavy-2"]
    assert second["command"] == heavy["command"] and second["healthcheck"] == heavy["healthcheck"]
    assert second["depends_on"]["export"]["condition"] == "service_completed_successfully"
    assert {p["target"] for p in ports(second)} == TRITON_PORTS
    assert {p["host_ip"] for p in ports(second)} == {"127.0.0.1"}
    assert not {p["published"] for p in ports(second)} & {p["published"] for p in ports(heavy)}
    urls = parse_heavy_urls(services["router"]["environment"]["TOKENROUTER_HEAVY_URL"])
    assert urls == ("heavy:8001", "heavy-2:8001")
    assert "heavy-2" not in in_profile(compose_config("split"), "split")  # split alone: one heavy server


def test_variables_reach_the_resolved_config():
    env = {"TOKENROUTER_SOURCES": "/data/models", "HEAVY_MODEL": "qwen-1.5b",
           "TRITON_HTTP_PORT": "18000", "TOKENROUTER_HEAVY_URL": "gpu-box:8001",
           "PY_SHM_DEFAULT_BYTES": "1048576"}
    services = compose_config("split", env)["services"]
    assert "/data/models:/sources:ro" in services["export"]["volumes"]
    assert services["export"]["environment"]["HEAVY_SRC"] == "/sources/qwen-1.5b"
    assert {p["published"] for p in ports(services["router"])} >= {18000}
    assert services["router"]["environment"]["TOKENROUTER_HEAVY_URL"] == "gpu-box:8001"
    assert "--backend-config=python,shm-default-byte-size=1048576" in services["heavy"]["entrypoint"]


# ---- Dockerfile and requirements ----------------------------------------------------------
def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


# NVIDIA's Triton security bulletins from the one 25.07 fixed on (NVIDIA/product-security; the
# bulletin's number: its CVEs and the first NGC release that fixes them). docs/security.md,
# "Triton versions and the bulletins", is the same table in words.
BULLETINS = {
    "5687": ("25.07", ["CVE-2025-23310", "CVE-2025-23311", "CVE-2025-23317", "CVE-2025-23318", "CVE-2025-23319",
                       "CVE-2025-23320", "CVE-2025-23321", "CVE-2025-23322", "CVE-2025-23323", "CVE-2025-23324",
                       "CVE-2025-23325", "CVE-2025-23326", "CVE-2025-23327", "CVE-2025-23331", "CVE-2025-23333",
                       "CVE-2025-23334", "CVE-2025-23335"]),
    "5691": ("25.08", ["CVE-2025-23316", "CVE-2025-23268", "CVE-2025-23328", "CVE-2025-23329",
                       "CVE-2025-23336"]),
    "5723": ("25.09", ["CVE-2025-33202"]),
    "5734": ("25.10", ["CVE-2025-33211", "CVE-2025-33201"]),
    "5790": ("26.01", ["CVE-2025-33238", "CVE-2025-33254", "CVE-2026-24158"]),
    "5816": ("26.02", ["CVE-2026-24146", "CVE-2026-24173", "CVE-2026-24174", "CVE-2026-24175",
                       "CVE-2026-24147"]),
    "5828": ("26.03", ["CVE-2026-24207", "CVE-2026-24213", "CVE-2026-24214", "CVE-2026-24209",
                       "CVE-2026-24210", "CVE-2026-24206", "CVE-2026-24215", "CVE-2026-24208"]),
    "5848": ("26.04", ["CVE-2026-24264", "CVE-2026-24266"]),
    "5853": ("26.05", ["CVE-2026-47476", "CVE-2026-47477", "CVE-2026-47478", "CVE-2026-47479",
                       "CVE-2026-47480", "CVE-2026-47482", "CVE-2026-47481"]),
    "5860": ("26.03", ["CVE-2026-47487"]),
    "5865": ("26.06", ["CVE-2026-47627", "CVE-2026-47629", "CVE-2026-47628", "CVE-2026-47606",
                       "CVE-2026-47630"]),
    "5875": ("26.07", ["CVE-2026-16497", "CVE-2026-47625"]),
}
SECURITY_DOC = ROOT / "docs" / "security.md"


def triton_release() -> str:
    return re.search(r"^ARG TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:(\d+\.\d+)-py3$", dockerfile(), re.M).group(1)


def test_image_release_carries_every_bulletin_fix():
    release = tuple(int(x) for x in triton_release().split("."))
    for bulletin, (fixed, _) in BULLETINS.items():
        assert release >= tuple(int(x) for x in fixed.split(".")), f"bulletin {bulletin} needs {fixed}"
    # the security doc names the image's release and every bulletin with its CVEs and release
    section = SECURITY_DOC.read_text().split("## Triton versions and the bulletins", 1)[1].split("\n## ", 1)[0]
    assert f"tritonserver:{triton_release()}-py3" in section
    for bulletin, (fixed, cves) in BULLETINS.items():
        row = next((line for line in section.splitlines() if f"answer {bulletin}" in line), None)
        assert row, f"bulletin {bulletin} is missing from docs/security.md"
        assert f"| {fixed}" in row and all(cve in row for cve in cves), row


def test_base_image_is_pinned_by_a_digest_the_build_cannot_do_without():
    text = dockerfile()
    # no default digest: a digest is read from the registry by whoever builds, never made up
    assert re.search(r"^ARG TRITON_IMAGE_DIGEST$", text, re.M)
    assert re.search(r"^FROM \$\{TRITON_IMAGE\}@\$\{TRITON_IMAGE_DIGEST\} AS serve$", text, re.M)
    assert len(re.findall(r"^FROM ", text, re.M)) == 2  # serve (pinned) and export (FROM serve)
    for name in PROFILES:
        for svc, d in in_profile(compose_config(name), name).items():
            assert d["build"]["args"]["TRITON_IMAGE_DIGEST"] == "", svc
    digest = "sha256:" + "ab" * 32
    router = compose_config("split", {"TRITON_IMAGE_DIGEST": digest})["services"]["router"]
    assert router["build"]["args"]["TRITON_IMAGE_DIGEST"] == digest


def run_pin(tmp_path: Path, printed: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/pin-triton-image.sh with a stand-in `docker` that prints a manifest digest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "docker"
    fake.write_text(f'#!/usr/bin/env bash\necho "$@" > "{tmp_path}/docker-args"\necho "{printed}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ENV_FILE": str(tmp_path / ".env")}
    return subprocess.run(["bash", str(ROOT / "scripts/pin-triton-image.sh"), *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_pin_script_writes_the_registry_digest_and_refuses_anything_else(tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    env_file = tmp_path / ".env"
    env_file.write_text("TRITON_BIND_ADDRESS=127.0.0.1\nTRITON_IMAGE_DIGEST=sha256:old\n")
    ok = run_pin(tmp_path, digest)
    assert ok.returncode == 0, ok.stderr
    assert "nvcr.io/nvidia/tritonserver:26.09-py3" in (tmp_path / "docker-args").read_text()
    assert env_file.read_text() == f"TRITON_BIND_ADDRESS=127.0.0.1\nTRITON_IMAGE_DIGEST={digest}\n"
    for bad in ("", "sha256:abc", "latest", f"{digest} extra"):
        refused = run_pin(tmp_path, bad)
        assert refused.returncode != 0 and "digest" in refused.stderr, bad
        assert env_file.read_text().endswith(f"TRITON_IMAGE_DIGEST={digest}\n")  # left as it was


def test_dockerfile_stages_base_image_and_copies():
    text = dockerfile()
    assert triton_release() == "26.09"
    assert re.search(r"^FROM serve AS export$", text, re.M)
    assert "pip install --no-deps --no-build-isolation ." in text  # the CPU-venv pins stay out of the image
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is missing"
    for req in re.findall(r"-r (docker/\S+)", text):
        assert (ROOT / req).is_file(), req


def pip_resolve(requirements: Path, tmp_path: Path, python: str = "3.12", extra: list[str] = ()) -> dict[str, str]:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", *extra,
           "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--abi", "cp" + python.replace(".", ""), "--target", str(tmp_path / "t"),
           "--report", str(report), "-r", str(requirements)]
    for platform in PIP_PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, \
        f"pip could not resolve {requirements.name} for Python {python}:\n{proc.stderr[-3000:]}"
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


@pytest.mark.index  # pip resolves against the package index: minutes, not a pure test
@pytest.mark.parametrize("requirements", ["requirements-export.txt", "requirements-export.lock"])
def test_image_requirements_resolve(tmp_path, requirements):
    """For Python 3.12, the 26.09 image's (Ubuntu 24.04); the lock with its hashes checked."""
    # the export requirements include the serving ones (-r), so one resolve checks both
    assert "-r requirements-serve.txt" in (ROOT / "docker/requirements-export.txt").read_text()
    # the lock: hashes required, and complete (pip resolves it without adding a package); in
    # hash-checking mode pip checks Requires-Python against its own interpreter, not against
    # --python-version, so that check is left to the .txt case (uv made the lock for 3.12)
    extra = ["--require-hashes", "--ignore-requires-python"] if requirements.endswith(".lock") else []
    resolved = pip_resolve(ROOT / "docker" / requirements, tmp_path, "3.12", extra)
    assert resolved["onnxruntime-gpu"].startswith("1.23.")
    assert "onnxruntime" not in resolved, "CPU onnxruntime would clash with onnxruntime-gpu"
    assert resolved["torch"] == "2.10.0"
    assert resolved["tritonclient"] == "2.51.0"
    assert int(resolved["numpy"].split(".")[0]) < 2
    cuda13 = [n for n in resolved if n.endswith("-cu13") or n == "cuda-toolkit"]
    assert not cuda13, f"CUDA 13 packages in a CUDA 12 image: {cuda13}"


# ---- lock files (scripts/lock.sh) ---------------------------------------------------------
LOCK = ROOT / "requirements.lock"
LOCK_PYTHON = (3, 11)  # the interpreter and machine requirements.lock was made for (scripts/setup.sh)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a lock file made by scripts/lock.sh."""
    entries: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in path.read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==(\S+)", line):
            name = canonical(m.group(1))
            entries[name] = (m.group(2), [])
        elif (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)) and name:
            entries[name][1].append(h.group(1))
        elif line.strip() and not line.startswith("#") and not line.startswith("    --hash"):
            pytest.fail(f"{path.name}: unexpected line {line!r}")
    return entries


def requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            lines += requirement_lines(path.parent / line[3:])
        elif line:
            lines.append(line)
    return lines


def pyproject_requirements() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    blocks = [re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1),
              re.search(r"^dev = \[(.*?)\]", text, re.M | re.S).group(1)]
    return [s for block in blocks for s in re.findall(r'"([^"]+)"', "\n".join(
        line.split("#", 1)[0] for line in block.splitlines()))]


def assert_lock_satisfies(lock: Path, requirements: list[str]):
    from packaging.requirements import Requirement

    entries = locked(lock)
    assert entries, lock
    for name, (version, hashes) in entries.items():
        assert hashes, f"{lock.name}: {name}=={version} has no hash"
    for line in requirements:
        req = Requirement(line)
        name = canonical(req.name)
        assert name in entries, f"{lock.name} misses {line} (rerun scripts/lock.sh)"
        version = entries[name][0]
        assert req.specifier.contains(version, prereleases=True), \
            f"{lock.name} has {name}=={version}, outside {line} (rerun scripts/lock.sh)"


def test_venv_lock_pins_every_dependency_with_hashes():
    assert_lock_satisfies(LOCK, pyproject_requirements())
    assert locked(LOCK)["torch"][0] == "2.13.0+cpu"  # the CPU build, not the CUDA one
    assert "nvidia-cudnn-cu13" not in locked(LOCK) and "nvidia-cudnn-cu12" not in locked(LOCK)


def test_image_locks_pin_their_requirements_and_the_images_install_them_with_hashes():
    for image in ("serve", "export"):
        assert_lock_satisfies(ROOT / f"docker/requirements-{image}.lock",
                              requirement_lines(ROOT / f"docker/requirements-{image}.txt"))
        assert f"pip install --require-hashes --no-deps -r docker/requirements-{image}.lock" in dockerfile()
    assert not re.search(r"pip install (?!--require-hashes|--no-deps --no-build-isolation \.)", dockerfile())


def test_setup_installs_the_lock_with_hashes():
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "LOCK=requirements.lock" in setup and '--require-hashes --no-deps -r "$LOCK"' in setup
    assert f"LOCK_PYTHON={LOCK_PYTHON[0]}.{LOCK_PYTHON[1]}" in setup
    assert 'cat pyproject.toml "$LOCK"' in setup  # a changed lock reinstalls
    if sys.version_info[:2] != LOCK_PYTHON:
        pytest.skip(f"this venv is Python {sys.version_info[0]}.{sys.version_info[1]}: setup installs it unlocked")
    from importlib.metadata import distributions

    installed = {canonical(d.metadata["Name"]): d.version for d in distributions()}
    drift = {n: (v, installed.get(n)) for n, (v, _) in locked(LOCK).items() if installed.get(n) != v}
    assert not drift, f"the venv differs from requirements.lock (run make setup): {drift}"


def test_pyproject_allows_python_310():
    text = (ROOT / "pyproject.toml").read_text()
    from packaging.specifiers import SpecifierSet

    spec = re.search(r'requires-python = "([^"]+)"', text).group(1)
    assert "3.10" in SpecifierSet(spec), f"package must install on 3.10; requires-python is {spec!r}"


def test_sources_are_python_310_compatible():
    files = [p for d in SOURCE_DIRS if (ROOT / d).exists() for p in (ROOT / d).rglob("*.py")]
    assert files
    problems = []
    for path in files:
        text = path.read_text()
        try:
            ast.parse(text, filename=str(path), feature_version=(3, 10))
        except SyntaxError as exc:
            problems.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
        for pattern in PY311_ONLY:
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path.relative_to(ROOT)}:{line}: 3.11+ only: {m.group(0)}")
    assert not problems, "not Python 3.10 compatible:\n" + "\n".join(problems)


# ---- container scripts --------------------------------------------------------------------
def run_export(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    """docker/export.sh with a stand-in `tokenrouter` that writes a marker repository."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tokenrouter"
    fake.write_text('#!/usr/bin/env bash\n'
                    'set -e; while [ $# -gt 0 ]; do case "$1" in --out) out=$2; shift;; '
                    '--device) dev=$2; shift;; esac; shift; done\n'
                    '[ "${FAIL:-0}" = 1 ] && exit 3\n'
                    'mkdir -p "$out/heavy"; echo "{\\"device\\": \\"$dev\\"}" > "$out/export.json"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(ROOT / "docker/export.sh")], capture_output=True,
                          text=True, env=full, timeout=60)


def test_export_script_builds_then_skips_then_forces(tmp_path):
    src, out = tmp_path / "src", tmp_path / "models"
    src.mkdir()
    out.mkdir()
    env = {"HEAVY_SRC": str(src), "LIGHT_SRC": str(src), "OUT_DIR": str(out), "DEVICE": "cpu"}
    first = run_export(tmp_path, env)
    assert first.returncode == 0, first.stderr
    assert json.loads((out / "export.json").read_text()) == {"device": "cpu"}
    assert not (out / ".export-tmp").exists()
    again = run_export(tmp_path, {**env, "DEVICE": "cuda"})
    assert again.returncode == 0 and "keeping the repository" in again.stdout
    assert json.loads((out / "export.json").read_text()) == {"device": "cpu"}
    forced = run_export(tmp_path, {**env, "DEVICE": "cuda", "FORCE_EXPORT": "1"})
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "export.json").read_text()) == {"device": "cuda"}


def test_export_script_failure_keeps_the_old_repository(tmp_path):
    src, out = tmp_path / "src", tmp_path / "models"
    src.mkdir()
    out.mkdir()
    (out / "export.json").write_text('{"device": "old"}')
    env = {"HEAVY_SRC": str(src), "LIGHT_SRC": str(src), "OUT_DIR": str(out),
           "FORCE_EXPORT": "1", "FAIL": "1"}
    assert run_export(tmp_path, env).returncode != 0
    assert (out / "export.json").read_text() == '{"device": "old"}'
    missing = run_export(tmp_path, {**env, "HEAVY_SRC": str(tmp_path / "nope")})
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_healthcheck_script(tmp_path):
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = str(ROOT / "docker/healthcheck.py")
    try:
        port = str(server.server_address[1])
        up = subprocess.run([sys.executable, script], env={**os.environ, "TRITON_HTTP_PORT": port},
                            capture_output=True, timeout=30)
        assert up.returncode == 0, up.stderr
    finally:
        server.shutdown()
        server.server_close()
    down = subprocess.run([sys.executable, script], env={**os.environ, "TRITON_HTTP_PORT": port},
                          capture_output=True, text=True, timeout=30)
    assert down.returncode == 1 and "not ready" in down.stderr


# ---- secure defaults ----------------------------------------------------------------------
def test_ports_bind_loopback_unless_opened(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        if svc in SERVERS:
            assert {p["host_ip"] for p in ports(d)} == {"127.0.0.1"}, svc
    opened = in_profile(compose_config(name, {"TRITON_BIND_ADDRESS": "0.0.0.0"}), name)
    for svc, d in opened.items():
        if svc in SERVERS:
            assert {p["host_ip"] for p in ports(d)} == {"0.0.0.0"}, svc


def test_servers_get_the_security_environment(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        if svc in SERVERS:
            env = d["environment"]
            assert env["TOKENROUTER_RESTRICTED_APIS"] == \
                "model-repository,model-config,logging,shared-memory,trace", svc
            assert "TOKENROUTER_ADMIN_KEY" in env and "TOKENROUTER_BRANCH_KEY" in env, svc
    env = {"TOKENROUTER_ADMIN_KEY": "k" * 20, "TOKENROUTER_BRANCH_KEY": "b" * 20}
    router = compose_config("split", env)["services"]["router"]["environment"]
    assert router["TOKENROUTER_ADMIN_KEY"] == "k" * 20 and router["TOKENROUTER_BRANCH_KEY"] == "b" * 20
    assert router["TOKENROUTER_HEAVY_URL"] == "heavy:8001"


def test_image_runs_as_an_unprivileged_user_that_cannot_write_the_models():
    text = dockerfile()
    serve, export = text.split("FROM serve AS export")
    users = re.findall(r"^USER (\S+)$", serve, re.M)
    assert users and users[-1] not in ("root", "0")
    # the serving user owns nothing of /models (root's, 0755): read-only for it
    assert "chown" not in serve and "chmod" not in serve and "mkdir -p /models" in serve
    # the one-shot export writes it as its own user, who owns /models in the export image (a
    # fresh named volume takes that ownership)
    exporter = re.findall(r"^USER (\S+)$", export, re.M)[-1]
    assert exporter not in ("root", "0", users[-1])
    assert re.search(rf"chown {exporter}:\S+ /models$", export, re.M)
    assert '"/opt/tokenrouter/docker/tritonserver.sh"' in serve


def memory_bytes(value) -> int:
    """compose v1 prints mem_limit as given ("16g"), v2 in bytes."""
    if isinstance(value, int):
        return value
    number, unit = re.fullmatch(r"(\d+)([bkmg]?)", str(value).lower()).groups()
    return int(number) << {"": 0, "b": 0, "k": 10, "m": 20, "g": 30}[unit]


def test_every_service_drops_privileges_and_has_a_memory_limit(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        assert d["cap_drop"] == ["ALL"], svc
        assert "no-new-privileges:true" in d["security_opt"], svc
        assert memory_bytes(d["mem_limit"]) >= 4 << 30, svc
    limits = {"TRITON_MEM_LIMIT": "3g", "HEAVY_MEM_LIMIT": "5g", "ROUTER_MEM_LIMIT": "6g", "EXPORT_MEM_LIMIT": "7g"}
    services = compose_config(name, limits)["services"]
    expected = {"triton": 3, "triton-cpu": 3, "heavy": 5, "router": 6, "export": 7, "export-cpu": 7}
    for svc in in_profile(config, name):
        assert memory_bytes(services[svc]["mem_limit"]) == expected[svc] << 30, svc


def test_servers_mount_the_models_read_only(profile):
    name, config = profile
    for svc, d in in_profile(config, name).items():
        models = [v for v in d["volumes"] if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == "/models"]
        assert len(models) == 1, svc
        volume = models[0]
        read_only = volume.get("read_only", False) if isinstance(volume, dict) else volume.endswith(":ro")
        assert read_only == (svc in SERVERS), f"{svc}: {volume}"  # only the one-shot export writes


def run_wrapper(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """docker/tritonserver.sh with a stand-in tritonserver that prints its arguments."""
    fake = tmp_path / "tritonserver"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    full = {**os.environ, "TRITONSERVER": str(fake), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
            "TOKENROUTER_ADMIN_KEY_FILE": str(tmp_path / "admin.key"), **env}
    full = {k: v for k, v in full.items() if v is not None}
    return subprocess.run(["bash", str(ROOT / "docker/tritonserver.sh"), *args], capture_output=True,
                          text=True, env=full, timeout=60)


def test_server_wrapper_adds_restriction_and_strict_flags(tmp_path):
    apis = "model-repository,model-config,logging,shared-memory,trace"
    given = run_wrapper(tmp_path, {"TOKENROUTER_ADMIN_KEY": "a" * 20, "TOKENROUTER_RESTRICTED_APIS": None},
                        "--model-repository=/models", "--model-control-mode=explicit")
    assert given.returncode == 0, given.stderr
    args = given.stdout.split()
    assert args[:2] == ["--exit-on-error=true", "--strict-readiness=true"]
    assert f"--http-restricted-api={apis}:tokenrouter-admin-key={'a' * 20}" in args
    assert f"--grpc-restricted-protocol={apis}:tokenrouter-admin-key={'a' * 20}" in args
    assert args[-2:] == ["--model-repository=/models", "--model-control-mode=explicit"]
    assert not (tmp_path / "admin.key").exists()

    generated = run_wrapper(tmp_path, {"TOKENROUTER_ADMIN_KEY": None, "TOKENROUTER_RESTRICTED_APIS": None})
    assert generated.returncode == 0, generated.stderr
    key = (tmp_path / "admin.key").read_text().strip()
    assert len(key) >= 40 and stat.S_IMODE((tmp_path / "admin.key").stat().st_mode) == 0o600
    assert f"--http-restricted-api={apis}:tokenrouter-admin-key={key}" in generated.stdout.split()
    assert generated.stdout.count(key) == 2  # in the two flags only, never in its own message


def test_server_wrapper_limits_http_input_size_as_serve_does(tmp_path):
    from tokenrouter_backend.server.door import DEFAULT_MAX_REQUEST_BYTES

    newer = tmp_path / "newer" / "tritonserver"  # a Triton >= 2.59: its --help lists the option
    newer.parent.mkdir()
    newer.write_text('#!/usr/bin/env bash\n[ "$1" = --help ] && { echo "  --http-max-input-size <integer>"; exit 1; }\n'
                     'printf "%s\\n" "$@"\n')
    newer.chmod(0o755)
    key = {"TOKENROUTER_ADMIN_KEY": "a" * 20, "TRITONSERVER": str(newer)}
    default = run_wrapper(tmp_path, {**key, "TOKENROUTER_MAX_REQUEST_BYTES": None})
    assert default.returncode == 0, default.stderr
    assert f"--http-max-input-size={DEFAULT_MAX_REQUEST_BYTES}" in default.stdout.split()
    raised = run_wrapper(tmp_path, {**key, "TOKENROUTER_MAX_REQUEST_BYTES": "1048576"})
    assert "--http-max-input-size=1048576" in raised.stdout.split()
    for bad in ("0", "8MiB", "-1"):
        res = run_wrapper(tmp_path, {**key, "TOKENROUTER_MAX_REQUEST_BYTES": bad})
        assert res.returncode == 2 and "TOKENROUTER_MAX_REQUEST_BYTES" in res.stderr, bad
    # an older tritonserver (the wheel's 2.51) would not start with the flag: left out, said so
    older = run_wrapper(tmp_path, {"TOKENROUTER_ADMIN_KEY": "a" * 20})
    assert older.returncode == 0 and "--http-max-input-size" not in older.stdout
    assert "has no --http-max-input-size" in older.stderr


@pytest.mark.parametrize("args", [
    ["--model-control-mode", "explicit"],  # tritonserver (getopt_long) takes the two-argument form
    ["--model-control-mode", "poll"],
    ["--model-control-mode=EXPLICIT"],  # and the mode in any case
    ["--model-cont=explicit"],  # and an unambiguous prefix of the option's name
    ["--model-control-mode=none", "--model-control-mode", "explicit"],  # the last one wins
])
def test_server_wrapper_refuses_every_spelling_of_load_enabling_model_control(tmp_path, args):
    refused = run_wrapper(tmp_path, {"TOKENROUTER_RESTRICTED_APIS": "logging,trace"}, *args)
    assert refused.returncode == 2 and "needs model-repository" in refused.stderr, refused.stderr
    opened = run_wrapper(tmp_path, {"TOKENROUTER_RESTRICTED_APIS": "none"}, *args)
    assert opened.returncode == 2, opened.stdout
    allowed = run_wrapper(tmp_path, {"TOKENROUTER_RESTRICTED_APIS": None, "TOKENROUTER_ADMIN_KEY": "a" * 20}, *args)
    assert allowed.returncode == 0 and allowed.stdout.split()[-len(args):] == args, allowed.stderr


def test_server_wrapper_lets_other_model_control_spellings_through(tmp_path):
    env = {"TOKENROUTER_RESTRICTED_APIS": "logging"}
    for args in (["--model-control-mode", "none"], ["--model-control-mode=explicit", "--model-control-mode=none"],
                 ["--model-repository", "/m"], ["--model-config-name", "explicit"]):
        res = run_wrapper(tmp_path, env, *args)
        assert res.returncode == 0 and res.stdout.split()[-len(args):] == args, (args, res.stderr)


def test_server_wrapper_refuses_open_explicit_mode_and_bad_keys(tmp_path):
    opened = run_wrapper(tmp_path, {"TOKENROUTER_RESTRICTED_APIS": "none"}, "--model-repository=/m")
    assert opened.returncode == 0 and "restricted" not in opened.stdout
    refused = run_wrapper(tmp_path, {"TOKENROUTER_RESTRICTED_APIS": "logging"}, "--model-control-mode=explicit")
    assert refused.returncode == 2 and "needs model-repository" in refused.stderr
    for bad in ("short", "has:colon-long-enough"):
        res = run_wrapper(tmp_path, {"TOKENROUTER_ADMIN_KEY": bad, "TOKENROUTER_RESTRICTED_APIS": None})
        assert res.returncode == 2, bad


def test_server_wrapper_runs_tritonserver_under_the_stub_watchdog_by_default(tmp_path):
    """The stand-in prints its parent's command line: the watchdog, or (0) the test itself."""
    fake = tmp_path / "tritonserver"
    fake.write_text('#!/usr/bin/env bash\ntr "\\0" " " < /proc/$PPID/cmdline; echo; exit 5\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    base = {**os.environ, "TRITONSERVER": str(fake), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
            "TOKENROUTER_ADMIN_KEY": "a" * 20}
    base.pop("TOKENROUTER_STUB_WATCH", None)

    def wrapper(**env) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "docker/tritonserver.sh"), "--http-port=18999"],
                              capture_output=True, text=True, env={**base, **env}, timeout=60)

    watched = wrapper()
    assert watched.returncode == 5, watched.stderr  # tritonserver's own exit code, passed on
    assert "-m tokenrouter_backend.server.stub_watch --poll-s 2 -- " in watched.stdout
    assert "stub_watch: tritonserver exited with code 5" in watched.stderr
    polled = wrapper(TOKENROUTER_STUB_WATCH="1", TOKENROUTER_STUB_WATCH_POLL_S="0.5")
    assert "stub_watch --poll-s 0.5 -- " in polled.stdout
    plain = wrapper(TOKENROUTER_STUB_WATCH="0")
    assert plain.returncode == 5 and "tokenrouter_backend.server.stub_watch" not in plain.stdout
    assert "stub_watch:" not in plain.stderr
    bad = wrapper(TOKENROUTER_STUB_WATCH="yes")
    assert bad.returncode == 2 and "TOKENROUTER_STUB_WATCH must be 0 or 1, got 'yes'" in bad.stderr
    bad_poll = wrapper(TOKENROUTER_STUB_WATCH_POLL_S="0")
    assert bad_poll.returncode == 2 and "--poll-s must be in (0, 60]" in bad_poll.stderr
