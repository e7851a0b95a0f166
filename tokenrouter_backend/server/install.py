"""The pieces of tritonserver in the nvidia-pytriton wheel, and a backend directory for them.

No Docker: the wheel carries the server binary, its libraries, the Python backend and one
Python-backend stub per Python version. This module puts them together:

* ``LD_LIBRARY_PATH``: the running Python's ``LIBDIR`` first (else the stub binds the system's
  older libpython and ``import torch`` fails inside a model), then ``nvidia_pytriton.libs``;
* the stub for the running Python copied beside ``libtriton_python.so`` in a backend directory
  under the data directory (the venv stays untouched);
* the venv's ``bin`` first on ``PATH`` (the stub finds its ``sys.prefix`` through ``python3``);
* model.py files can ``import tokenrouter_backend``: the stub runs with
  ``sys.flags.ignore_environment`` set, so ``PYTHONPATH`` is ignored; but it puts the backend's
  own ``python/`` directory on ``sys.path``, so a symlink there named ``tokenrouter_backend``
  points at this package (one backend directory per package location).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tokenrouter_backend.server import paths
from tokenrouter_backend.server.errors import TritonServerError

PACKAGE_NAME = "tokenrouter_backend"
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the tokenrouter_backend package


@dataclass(frozen=True)
class TritonInstall:
    """The pieces of tritonserver inside the nvidia-pytriton wheel."""

    binary: Path
    libs_dir: Path
    python_backend_dir: Path   # libtriton_python.so + triton_python_backend_utils.py
    stubs_dir: Path            # <python version>/triton_python_backend_stub
    caches_dir: Path

    @classmethod
    def find(cls) -> "TritonInstall":
        spec = importlib.util.find_spec("pytriton")  # locates the wheel without importing it
        if spec is None or not spec.submodule_search_locations:
            raise TritonServerError("nvidia-pytriton is not installed: no tritonserver binary "
                                    "(pip install nvidia-pytriton==0.7.0)")
        pkg = Path(list(spec.submodule_search_locations)[0])
        server = pkg / "tritonserver"
        install = cls(binary=server / "bin" / "tritonserver",
                      libs_dir=pkg.parent / "nvidia_pytriton.libs",
                      python_backend_dir=server / "backends" / "python",
                      stubs_dir=server / "python_backend_stubs",
                      caches_dir=server / "caches")
        if not install.binary.is_file():
            raise TritonServerError(f"tritonserver binary missing from the wheel: {install.binary}")
        return install

    def stub_for_running_python(self) -> Path:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = self.stubs_dir / version / "triton_python_backend_stub"
        if not stub.is_file():
            have = sorted(p.name for p in self.stubs_dir.iterdir()) if self.stubs_dir.is_dir() else []
            raise TritonServerError(f"no Python-backend stub for Python {version} in the wheel "
                                    f"({self.stubs_dir}; available: {', '.join(have) or 'none'})")
        return stub


def prepare_backend_dir(install: TritonInstall, cache_root: Path | None = None,
                        package_dir: Path | None = None) -> Path:
    """A ``--backend-directory`` whose ``python/`` holds the backend, the matching stub and a
    ``tokenrouter_backend`` symlink to ``package_dir`` (default: this package).

    Built once per (wheel location, Python version, package location) under the data
    directory, atomically.
    """
    stub = install.stub_for_running_python()
    package_dir = (package_dir or PACKAGE_DIR).resolve()
    key_src = (f"{install.python_backend_dir}|{stub}|{stub.stat().st_size}|"
               f"{stub.stat().st_mtime_ns}|{package_dir}")
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    root = (cache_root or paths.triton_cache_dir()) / f"backends-py{version}-{key}"
    if (root / "python" / "triton_python_backend_stub").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".backends-", dir=root.parent))
    try:
        python_dir = staging / "python"
        python_dir.mkdir()
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(install.python_backend_dir / name, python_dir / name)
        shutil.copy2(stub, python_dir / "triton_python_backend_stub")
        (python_dir / PACKAGE_NAME).symlink_to(package_dir, target_is_directory=True)
        try:
            staging.rename(root)
        except OSError:  # another process prepared it meanwhile
            if not (root / "python" / "triton_python_backend_stub").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def server_environment(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its stubs (see the module docstring for why)."""
    env = dict(os.environ if base is None else base)

    def prepend(var: str, *entries: str) -> None:
        old = [p for p in env.get(var, "").split(os.pathsep) if p]
        env[var] = os.pathsep.join([*entries, *[p for p in old if p not in entries]])

    prepend("LD_LIBRARY_PATH", sysconfig.get_config_var("LIBDIR"), str(install.libs_dir))
    prepend("PATH", str(Path(sys.executable).parent))
    env["PYTHONUNBUFFERED"] = "1"  # model.py prints reach the log at once
    return env
