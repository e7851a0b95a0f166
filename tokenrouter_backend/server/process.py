"""One tritonserver process on a model repository: start, wait until ready, stop.

``start()`` spawns the server in its own process group, ``wait_ready()`` polls
``/v2/health/ready`` and raises `TritonServerError` (with each failing model's error text
parsed from the log) if the server exits, a model fails to load or time runs out; ``stop()``
sends SIGTERM, waits, then SIGKILLs the whole group so no stub survives. As a context
manager it starts, waits and always stops. The backend directory and environment come from
``install``; `tokenrouter serve` (``cli/serve.py``) is the command-line front end.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Sequence

from tokenrouter_backend.server import paths
from tokenrouter_backend.server.errors import TritonServerError
from tokenrouter_backend.server.install import TritonInstall, prepare_backend_dir, server_environment
from tokenrouter_backend.server.logs import parse_model_errors, tail
from tokenrouter_backend.server.pids import (  # noqa: F401 - process_group_pids: re-exported
    kill_group,
    process_group_pids,
    remove_shm_regions,
    server_stubs,
    terminate_with_parent,
    wait_group_gone,
)
from tokenrouter_backend.server.ports import LOOPBACK, client_host, free_ports
from tokenrouter_backend.server.probe import http_status
from tokenrouter_backend.server.restrictions import RESTRICTED_APIS, Restriction
from tokenrouter_backend.server.stub_set import StubSet

MIB = 1024 * 1024
# Our largest tensors: a processed distribution over the Qwen2.5 vocabulary (151936 float32)
# for up to 17 positions (block size 16 + the bonus token) is 151936 * 4 * 17 ≈ 10.3 MB per
# request. The Python backend's shared-memory region per model instance starts at the default
# size and grows in growth-size steps; 64 MiB holds a batch of 6 such requests without growing.
DEFAULT_SHM_BYTES = 64 * MIB
DEFAULT_SHM_GROWTH_BYTES = 64 * MIB
DEFAULT_READY_TIMEOUT_S = 300.0   # the demo pair (1.5B + 0.5B ONNX) needs minutes to load on 2 cores
DEFAULT_EXIT_TIMEOUT_S = 10       # Triton's own grace for in-flight requests after SIGTERM
STOP_EXTRA_GRACE_S = 10.0         # then this long more before the process group gets SIGKILL
POLL_INTERVAL_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
PORT_RETRIES = 3                  # re-pick automatically chosen ports this often if one is taken
MODEL_CONTROL_MODES = ("none", "explicit", "poll")

PORT_IN_USE_RE = re.compile(r"already in use", re.IGNORECASE)


class TritonServer:
    """One tritonserver process on a model repository.

    Ports left as ``None`` are picked free on loopback (re-picked if one is taken meanwhile);
    once the server was ready they stay fixed, so a later ``start()`` comes back on them.
    ``model_control_mode`` is ``none`` (load everything at start), ``explicit`` (load
    ``load_models``, default ``["*"]``, and allow `load_model`/`unload_model`) or ``poll``.
    ``shm_default_bytes``/``shm_growth_bytes``: the Python backend's shared memory per model
    instance (see DEFAULT_SHM_BYTES). ``metrics_address``: where the metrics port listens
    (default ``address``; `serve` keeps HTTP and gRPC on loopback behind its door).
    ``log_path``: stdout+stderr of the server and its stubs (appended). ``ready_timeout_s``:
    default of `wait_ready`. ``restricted_apis``: Triton APIs that need the admin header
    (``restrictions.py``; ``()`` opens all), with ``admin_key`` (default
    ``$TOKENROUTER_ADMIN_KEY``, else random); explicit model control requires
    ``model-repository`` among them.
    """

    def __init__(self, repository: Path | str, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None,
                 address: str = LOOPBACK, metrics_address: str | None = None,
                 model_control_mode: str = "none",
                 load_models: Sequence[str] | None = None,
                 shm_default_bytes: int = DEFAULT_SHM_BYTES,
                 shm_growth_bytes: int = DEFAULT_SHM_GROWTH_BYTES,
                 log_path: Path | str | None = None, log_verbose: int = 0,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                 exit_timeout_s: int = DEFAULT_EXIT_TIMEOUT_S,
                 terminate_with_parent: bool = True,
                 restricted_apis: Sequence[str] = RESTRICTED_APIS, admin_key: str | None = None,
                 extra_args: Sequence[str] = ()):
        if model_control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model_control_mode must be one of {MODEL_CONTROL_MODES}, "
                             f"got {model_control_mode!r}")
        self.restriction = Restriction.create(restricted_apis, admin_key)
        if model_control_mode != "none" and not self.restriction.covers("model-repository"):
            raise ValueError(f"model_control_mode {model_control_mode!r} lets clients load models: "
                             "it needs 'model-repository' in restricted_apis")
        self.repository = Path(repository).resolve()
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self.http_port, self.grpc_port, self.metrics_port = self._pick_ports()
        self.address = address
        self.metrics_address = address if metrics_address is None else metrics_address
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
        self.shm_prefix: str | None = None  # the Python backend's shared-memory names (set by command())
        self._stubs = StubSet({})  # the Python stubs since the server became ready, followed across reloads

    # ---- endpoints
    @property
    def _client_host(self) -> str:
        return client_host(self.address)

    @property
    def http_url(self) -> str:
        return f"http://{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc expects."""
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        host = client_host(self.metrics_address)
        return f"http://{host}:{self.metrics_port}/metrics"

    @property
    def admin_headers(self) -> dict[str, str]:
        """The HTTP header a client adds to reach the restricted admin APIs."""
        return self.restriction.headers

    @property
    def admin_grpc_headers(self) -> dict[str, str]:
        """The gRPC metadata a client adds to reach the restricted admin APIs."""
        return self.restriction.grpc_headers

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ---- lifecycle
    def command(self, backend_dir: Path, install: TritonInstall) -> list[str]:
        """The tritonserver command line."""
        shm_prefix = f"tokenrouter_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.shm_prefix = shm_prefix
        cmd = [
            str(install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_dir}",
            f"--cache-directory={install.caches_dir}",
            f"--model-control-mode={self.model_control_mode}",
            f"--http-address={self.address}", f"--http-port={self.http_port}",
            f"--grpc-address={self.address}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.metrics_address}", f"--metrics-port={self.metrics_port}",
            f"--backend-config=python,shm-default-byte-size={self.shm_default_bytes}",
            f"--backend-config=python,shm-growth-byte-size={self.shm_growth_bytes}",
            # unique shared-memory names: several servers may run on one machine
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            "--exit-on-error=true", "--strict-readiness=true",
        ]
        cmd += self.restriction.flags()
        cmd += [f"--load-model={name}" for name in self.load_models]
        return cmd + self.extra_args

    def launch_command(self) -> tuple[list[str], dict[str, str]]:
        """The argv and environment `start` runs tritonserver with (backend directory prepared)."""
        install = TritonInstall.find()
        return self.command(prepare_backend_dir(install), install), server_environment(install)

    def start(self) -> "TritonServer":
        """Spawn the server (returns at once; see `wait_ready`).

        With ``terminate_with_parent`` (default) the server gets SIGTERM when the *thread*
        that called start() ends, so a killed launcher leaves no server behind — call it from
        a long-lived thread (normally the main one).
        """
        self._stubs = StubSet({})
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                raise TritonServerError(f"tritonserver already running (pid {self._proc.pid})")
            if not self.repository.is_dir():
                raise TritonServerError(f"model repository not found: {self.repository}")
            argv, env = self.launch_command()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
                self._log_offset = log.tell()
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # own process group: stop() kills stubs with it
                    preexec_fn=terminate_with_parent if self.terminate_with_parent else None)
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
            if self._http_status("/v2/health/ready") == 200:
                self._stubs = StubSet(server_stubs(self._proc.pid))
                # clients know these ports now: a later start() (a restart) comes back on them
                self._requested_ports = (self.http_port, self.grpc_port, self.metrics_port)
                return self
            if time.monotonic() > deadline:
                self._fail(f"tritonserver not ready after {timeout_s:.0f} s", errors)
            time.sleep(POLL_INTERVAL_S)

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL the whole process group; remove the Python backend's
        shared-memory regions it left (a killed stub never unlinks them). Returns the exit code."""
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
            kill_group(pgid)
            code = proc.wait()
            wait_group_gone(pgid, STOP_EXTRA_GRACE_S)
            remove_shm_regions(self.shm_prefix)
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
        """Triton reports ready AND every Python stub that was there when it became ready
        still runs: a killed stub leaves its model failing every request while Triton 2.51
        keeps answering ready."""
        return self._http_status("/v2/health/ready") == 200 and not self.lost_stubs()

    def lost_stubs(self) -> list[int]:
        """Stub pids that died since readiness (a branch crashed or was OOM-killed). Stubs that
        appear later are adopted; a stub that went with its model's unload or reload over the
        admin API did not die (``stub_set.py``)."""
        if self._proc is not None:
            self._stubs.follow(server_stubs(self._proc.pid), self._model_status)
        return sorted(self._stubs.dead)

    def stub_names(self) -> dict[int, str]:
        """The model each stub seen since readiness serves (pid -> model name)."""
        return self._stubs.names()

    def group_pids(self) -> list[int]:
        """Live processes of the server's process group (server and its Python stubs)."""
        return process_group_pids(self._proc.pid) if self._proc else []

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
        return http_status(self.http_url + path, HEALTH_REQUEST_TIMEOUT_S)

    def _model_status(self, model: str) -> int | None:
        return self._http_status(f"/v2/models/{urllib.parse.quote(model, safe='')}/ready")

    def _repository_call(self, name: str, action: str) -> None:
        url = f"{self.http_url}/v2/repository/models/{name}/{action}"
        request = urllib.request.Request(url, data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **self.restriction.headers})
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
        last_lines = tail(log_text)
        if not errors and last_lines:
            message = f"{message}; last log lines:\n{last_lines}"
        raise TritonServerError(message, errors, self.log_path, last_lines)
