"""Runs the real `tritonserver` 2.51 shipped in the nvidia-pytriton wheel on a model repository.

No Docker: the wheel carries the server binary, its libraries, the Python backend and one
Python-backend stub per Python version. `TritonServer` puts them together the way
docs/../shared DESIGN.md records (see "Triton on a machine without Docker"):

* ``LD_LIBRARY_PATH``: the running Python's ``LIBDIR`` first (else the stub binds the system's
  older libpython and ``import torch`` fails inside a model), then ``nvidia_pytriton.libs``;
* the stub for the running Python copied beside ``libtriton_python.so`` in a backend directory
  under the data directory (the venv stays untouched);
* the venv's ``bin`` first on ``PATH`` (the stub finds its ``sys.prefix`` through ``python3``);
* model.py files can ``import tokenrouter_backend``: the stub runs with
  ``sys.flags.ignore_environment`` set, so ``PYTHONPATH`` is ignored; but it puts the backend's
  own ``python/`` directory on ``sys.path``, so a symlink there named ``tokenrouter_backend``
  points at this package (one backend directory per package location).

Lifecycle: ``start()`` spawns the server in its own process group, ``wait_ready()`` polls
``/v2/health/ready`` and raises `TritonServerError` (with each failing model's error text
parsed from the log) if the server exits, a model fails to load or time runs out; ``stop()``
sends SIGTERM, waits, then SIGKILLs the whole group so no stub survives. As a context
manager it starts, waits and always stops.

`tokenrouter serve` (``add_arguments``/``run`` below) is the command-line front end.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tokenrouter_backend import paths

MIB = 1024 * 1024
# Our largest tensors: a processed distribution over the Qwen2.5 vocabulary (151936 float32)
# for up to 17 positions (block size 16 + the bonus token) is 151936 * 4 * 17 ≈ 10.3 MB per
# request. The Python backend's shared-memory region per model instance starts at the default
# size and grows in growth-size steps; 64 MiB holds a batch of 6 such requests without growing.
DEFAULT_SHM_BYTES = 64 * MIB
DEFAULT_SHM_GROWTH_BYTES = 64 * MIB
LOOPBACK = "127.0.0.1"
DEFAULT_READY_TIMEOUT_S = 300.0   # the demo pair (1.5B + 0.5B ONNX) needs minutes to load on 2 cores
DEFAULT_EXIT_TIMEOUT_S = 10       # Triton's own grace for in-flight requests after SIGTERM
STOP_EXTRA_GRACE_S = 10.0         # then this long more before the process group gets SIGKILL
POLL_INTERVAL_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
PORT_RETRIES = 3                  # re-pick automatically chosen ports this often if one is taken
LOG_TAIL_LINES = 40
MODEL_CONTROL_MODES = ("none", "explicit", "poll")
PACKAGE_NAME = "tokenrouter_backend"
PR_SET_PDEATHSIG = 1              # linux/prctl.h

FAILED_LOAD_RE = re.compile(r"failed to load '([^']+)'(?: version \d+)?: (.*)")
PORT_IN_USE_RE = re.compile(r"already in use", re.IGNORECASE)


class TritonServerError(RuntimeError):
    """The server exited, a model failed to load, or it was not ready in time.

    ``model_errors`` maps each failing model to its error text from the server log.
    """

    def __init__(self, message: str, model_errors: dict[str, str] | None = None,
                 log_path: Path | None = None, log_tail: str = ""):
        self.model_errors = dict(model_errors or {})
        self.log_path = log_path
        self.log_tail = log_tail
        details = "".join(f"\n  model '{name}': " + "\n    ".join(err.splitlines())
                          for name, err in self.model_errors.items())
        where = f"\n  server log: {log_path}" if log_path else ""
        super().__init__(f"{message}{details}{where}")


# --------------------------------------------------------------------------- the wheel's server

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
    package_dir = (package_dir or Path(__file__).resolve().parent).resolve()
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


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free right now on ``host`` (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports


# --------------------------------------------------------------------------- log parsing

def parse_model_errors(log_text: str) -> dict[str, str]:
    """Failing models and their error text from a tritonserver log.

    Triton logs ``failed to load 'NAME' version N: ERROR`` per failing model and, at start-up,
    a table of model states (``| NAME | 1 | UNAVAILABLE: ERROR |``, long cells wrapped onto
    continuation rows). The "failed to load" lines win; the table fills in the rest.
    """
    errors: dict[str, str] = {}
    for line in log_text.splitlines():
        match = FAILED_LOAD_RE.search(line)
        if match:
            errors.setdefault(match.group(1), _unescape(match.group(2).rstrip('"')).strip())
    for name, status in _model_table_rows(log_text):
        if status.startswith("UNAVAILABLE") and name not in errors:
            errors[name] = status.removeprefix("UNAVAILABLE:").strip()
    return errors


def _unescape(message: str) -> str:
    """Triton logs messages quoted, with newlines and quotes escaped."""
    return message.replace("\\n", "\n").replace('\\"', '"')


def _model_table_rows(log_text: str) -> list[tuple[str, str]]:
    """(model, status) rows of the last 'Model | Version | Status' table in the log."""
    rows: list[list[str]] = []
    in_table = False
    for line in log_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[:3] == ["Model", "Version", "Status"]:
            rows, in_table = [], True
        elif in_table and cells and len(cells) == 3:
            if cells[0]:
                rows.append(cells)
            elif rows:  # continuation of a wrapped cell
                rows[-1][2] = f"{rows[-1][2]} {cells[2]}".strip()
        elif in_table and not line.startswith("+"):
            in_table = False
    return [(r[0], r[2]) for r in rows]


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- the server

class TritonServer:
    """One tritonserver process on a model repository.

    Ports left as ``None`` are picked free on loopback (re-picked if one is taken meanwhile).
    ``model_control_mode`` is ``none`` (load everything at start), ``explicit`` (load
    ``load_models``, default ``["*"]``, and allow `load_model`/`unload_model`) or ``poll``.
    ``shm_default_bytes``/``shm_growth_bytes``: the Python backend's shared memory per model
    instance (see DEFAULT_SHM_BYTES). ``log_path``: stdout+stderr of the server and its
    stubs (appended). ``ready_timeout_s``: default of `wait_ready`.
    """

    def __init__(self, repository: Path | str, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None,
                 address: str = LOOPBACK, model_control_mode: str = "none",
                 load_models: Sequence[str] | None = None,
                 shm_default_bytes: int = DEFAULT_SHM_BYTES,
                 shm_growth_bytes: int = DEFAULT_SHM_GROWTH_BYTES,
                 log_path: Path | str | None = None, log_verbose: int = 0,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                 exit_timeout_s: int = DEFAULT_EXIT_TIMEOUT_S,
                 terminate_with_parent: bool = True,
                 extra_args: Sequence[str] = ()):
        if model_control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model_control_mode must be one of {MODEL_CONTROL_MODES}, "
                             f"got {model_control_mode!r}")
        self.repository = Path(repository).resolve()
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self.http_port, self.grpc_port, self.metrics_port = self._pick_ports()
        self.address = address
        self.model_control_mode = model_control_mode
        self.load_models = list(load_models) if load_models is not None else (
            ["*"] if model_control_mode == "explicit" else [])
        self.shm_default_bytes = shm_default_bytes
        self.shm_growth_bytes = shm_growth_bytes
        self.log_path = Path(log_path) if log_path else (
            paths.log_dir() / f"tritonserver-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
        self.log_verbose = log_verbose
        self.ready_timeout_s = ready_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.terminate_with_parent = terminate_with_parent
        self.extra_args = list(extra_args)
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0
        self._lock = threading.Lock()

    # ---- endpoints
    @property
    def _client_host(self) -> str:
        return LOOPBACK if self.address in ("0.0.0.0", "") else self.address

    @property
    def http_url(self) -> str:
        return f"http://{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc expects."""
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ---- lifecycle
    def command(self, backend_dir: Path, install: TritonInstall) -> list[str]:
        """The tritonserver command line."""
        shm_prefix = f"tokenrouter_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        cmd = [
            str(install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_dir}",
            f"--cache-directory={install.caches_dir}",
            f"--model-control-mode={self.model_control_mode}",
            f"--http-address={self.address}", f"--http-port={self.http_port}",
            f"--grpc-address={self.address}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.address}", f"--metrics-port={self.metrics_port}",
            f"--backend-config=python,shm-default-byte-size={self.shm_default_bytes}",
            f"--backend-config=python,shm-growth-byte-size={self.shm_growth_bytes}",
            # unique shared-memory names: several servers may run on one machine
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
        ]
        cmd += [f"--load-model={name}" for name in self.load_models]
        return cmd + self.extra_args

    def start(self) -> "TritonServer":
        """Spawn the server (returns at once; see `wait_ready`).

        With ``terminate_with_parent`` (default) the server gets SIGTERM when the *thread*
        that called start() ends, so a killed launcher leaves no server behind — call it from
        a long-lived thread (normally the main one).
        """
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                raise TritonServerError(f"tritonserver already running (pid {self._proc.pid})")
            if not self.repository.is_dir():
                raise TritonServerError(f"model repository not found: {self.repository}")
            install = TritonInstall.find()
            backend_dir = prepare_backend_dir(install)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
                self._log_offset = log.tell()
                self._proc = subprocess.Popen(
                    self.command(backend_dir, install), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=server_environment(install),
                    start_new_session=True,  # own process group: stop() kills stubs with it
                    preexec_fn=_terminate_with_parent if self.terminate_with_parent else None)
        return self

    def wait_ready(self, timeout_s: float | None = None) -> "TritonServer":
        """Block until ``/v2/health/ready`` answers 200; on failure stop and raise."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        retries = PORT_RETRIES
        while True:
            if self._proc is None:
                raise TritonServerError("tritonserver was not started")
            code = self._proc.poll()
            log_text = self.log_text()
            errors = parse_model_errors(log_text)
            if code is not None and not errors and retries > 0 and self._ports_automatic() \
                    and PORT_IN_USE_RE.search(log_text):
                retries -= 1
                self.http_port, self.grpc_port, self.metrics_port = self._pick_ports()
                self.start()
                continue
            if code is not None:
                self._fail(f"tritonserver exited with code {code} before it was ready", errors)
            if errors:
                self._fail("tritonserver could not load every model", errors)
            if self.is_ready():
                return self
            if time.monotonic() > deadline:
                self._fail(f"tritonserver not ready after {timeout_s:.0f} s", errors)
            time.sleep(POLL_INTERVAL_S)

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL the whole process group. Returns the exit code."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return None
            pgid = proc.pid  # start_new_session: the server leads its own group
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(self.exit_timeout_s + STOP_EXTRA_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(pgid)
            code = proc.wait()
            _wait_group_gone(pgid, STOP_EXTRA_GRACE_S)
            return code

    def __enter__(self) -> "TritonServer":
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- queries
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def is_ready(self) -> bool:
        return self._http_status("/v2/health/ready") == 200

    def group_pids(self) -> list[int]:
        """Live processes of the server's process group (server and its Python stubs)."""
        return _group_pids(self._proc.pid) if self._proc else []

    def log_text(self) -> str:
        """This run's part of the log file."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def load_model(self, name: str) -> None:
        """Load or reload a model (explicit model-control mode)."""
        self._repository_call(name, "load")

    def unload_model(self, name: str) -> None:
        self._repository_call(name, "unload")

    # ---- internals
    def _pick_ports(self) -> tuple[int, int, int]:
        auto = iter(free_ports(sum(p is None for p in self._requested_ports)))
        http, grpc, metrics = (p if p is not None else next(auto) for p in self._requested_ports)
        return http, grpc, metrics

    def _ports_automatic(self) -> bool:
        return any(p is None for p in self._requested_ports)

    def _http_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=HEALTH_REQUEST_TIMEOUT_S) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, OSError):
            return None

    def _repository_call(self, name: str, action: str) -> None:
        url = f"{self.http_url}/v2/repository/models/{name}/{action}"
        request = urllib.request.Request(url, data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.ready_timeout_s):
                return
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", errors="replace")
            raise TritonServerError(f"{action} of model '{name}' failed: HTTP {err.code} {body}",
                                    parse_model_errors(self.log_text()), self.log_path) from err

    def _fail(self, message: str, errors: dict[str, str]) -> None:
        self.stop()
        log_text = self.log_text()
        errors = errors or parse_model_errors(log_text)
        tail = _tail(log_text)
        if not errors and tail:
            message = f"{message}; last log lines:\n{tail}"
        raise TritonServerError(message, errors, self.log_path, tail)


def _terminate_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launching thread dies (Linux prctl).

    The server runs in its own session, so without this a launcher killed with SIGKILL
    would leave tritonserver running.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: stop() remains the only way
        pass


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _group_pids(pgid) and time.monotonic() < deadline:
        _kill_group(pgid)
        time.sleep(POLL_INTERVAL_S)


# --------------------------------------------------------------------------- `tokenrouter serve`

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=None,
                        help="model repository (default: the exported demo repository, "
                             "<data>/demo/repository)")
    parser.add_argument("--address", default=LOOPBACK,
                        help=f"address to listen on (default {LOOPBACK}; 0.0.0.0 for all)")
    for name, default in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        parser.add_argument(f"--{name}-port", type=int, default=default,
                            help=f"{name} port (default {default}; 0 = pick a free one)")
    parser.add_argument("--model-control-mode", choices=MODEL_CONTROL_MODES, default="none",
                        help="none: load all at start (default); explicit: load --load-model "
                             "(default all) and allow load/unload over the API")
    parser.add_argument("--load-model", action="append", default=None,
                        help="model to load in explicit mode (repeatable; default '*')")
    parser.add_argument("--shm-bytes", type=int, default=DEFAULT_SHM_BYTES,
                        help="Python-backend shared memory per model instance, bytes "
                             f"(default {DEFAULT_SHM_BYTES // MIB} MiB)")
    parser.add_argument("--shm-growth-bytes", type=int, default=DEFAULT_SHM_GROWTH_BYTES,
                        help=f"its growth step, bytes (default {DEFAULT_SHM_GROWTH_BYTES // MIB} MiB)")
    parser.add_argument("--log-file", type=Path, default=None,
                        help="server log (default <data>/logs/tritonserver-<time>-<pid>.log)")
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose")
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S,
                        help=f"seconds to wait for every model (default {DEFAULT_READY_TIMEOUT_S:.0f})")


def run(args: argparse.Namespace) -> int:
    repository = args.repository or paths.demo_repository()
    if not Path(repository).is_dir():
        print(f"tokenrouter serve: model repository not found: {repository}\n"
              "  (export one with `tokenrouter export ...`, or pass --repository)", file=sys.stderr)
        return 2
    port = lambda p: None if p == 0 else p  # noqa: E731
    server = TritonServer(repository, http_port=port(args.http_port), grpc_port=port(args.grpc_port),
                          metrics_port=port(args.metrics_port), address=args.address,
                          model_control_mode=args.model_control_mode, load_models=args.load_model,
                          shm_default_bytes=args.shm_bytes, shm_growth_bytes=args.shm_growth_bytes,
                          log_path=args.log_file, log_verbose=args.log_verbose,
                          ready_timeout_s=args.ready_timeout)
    stop_requested = threading.Event()
    serving = threading.Event()

    def on_signal(signum, _frame):
        stop_requested.set()
        if not serving.is_set():  # still loading models: abandon the wait at once
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"tokenrouter serve: starting tritonserver on {repository} (log: {server.log_path})",
              flush=True)
        server.start()
        server.wait_ready()
        print(f"ready\n  HTTP    {server.http_url}\n  gRPC    {server.grpc_url}\n"
              f"  metrics {server.metrics_url}", flush=True)
        serving.set()
        while not stop_requested.wait(POLL_INTERVAL_S):
            if not server.is_running():
                code = server.stop()
                print(f"tokenrouter serve: tritonserver exited with code {code}; "
                      f"last log lines:\n{_tail(server.log_text())}", file=sys.stderr)
                return 1
        print("tokenrouter serve: stopping", flush=True)
        return 0
    except TritonServerError as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tokenrouter serve: interrupted while loading; stopping", file=sys.stderr)
        return 130
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
