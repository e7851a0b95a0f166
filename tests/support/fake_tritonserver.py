"""A stand-in tritonserver for the stub watchdog's tests (run as a script, no Triton).

It answers ``/v2/health/ready`` 200 and ``/v2/models/<name>/ready`` 200 for a loaded model,
400 otherwise (as Triton does), on ``--http-port=N``. Each model of ``$FAKE_TRITON_MODELS``
(comma list) gets a "stub": a sleeping child whose argv names ``/repo/<model>/1/model.py``,
like a Python-backend stub. Lines appended to the file ``$FAKE_TRITON_CONTROL`` act on them:
``load M`` (a new stub, with the short-lived processes a real load forks), ``unload M`` (its
stubs end, M unknown), ``reload M`` (a new stub, then the old ones end), ``kill M`` (SIGKILL
of M's first stub; M stays loaded). SIGTERM ends the stubs and exits 0.
"""
from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PORT = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--http-port=")))
CONTROL = Path(os.environ["FAKE_TRITON_CONTROL"])
models: dict[str, list[subprocess.Popen]] = {}


def stub_argv(model: str, stub_name: str, seconds: float) -> list[str]:
    """A Python-backend stub's argv: script, shm region, sizes, parent pid, backend dir, IPC
    handle, then the stub's name."""
    return [sys.executable, "-c", f"import time; time.sleep({seconds})", f"/repo/{model}/1/model.py",
            "/tokenrouter_fake", "1048576", "1048576", str(os.getpid()), "/backends/python", "0", stub_name]


def spawn(name: str) -> None:
    stub = subprocess.Popen(stub_argv(name, f"{name}_0_{len(models.get(name, []))}", 3600))
    models.setdefault(name, []).append(stub)


def spawn_transient(name: str) -> None:
    """What a model load starts besides its instance stubs, each ending within a second: a
    forked child that has not exec'd a stub (no model.py in its argv) and the
    ``auto_complete_config`` stub (named after the model itself)."""
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)", "--fork-of-tritonserver"])
    subprocess.Popen(stub_argv(name, name, 0.8))


def end(stubs: list[subprocess.Popen]) -> None:
    for stub in stubs:
        stub.terminate()
        stub.wait()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        parts = self.path.split("/")
        if self.path == "/v2/health/ready":
            code = 200
        elif len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "ready":
            code = 200 if parts[3] in models else 400
        else:
            code = 404
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def on_term(*_):
    for stubs in list(models.values()):
        end(stubs)
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)
for model in filter(None, os.environ.get("FAKE_TRITON_MODELS", "").split(",")):
    spawn(model)
server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
done = 0
while True:
    lines = CONTROL.read_text().splitlines() if CONTROL.exists() else []
    for line in lines[done:]:
        action, name = line.split()
        if action == "load":
            spawn_transient(name)
            spawn(name)
        elif action == "unload":
            end(models.pop(name))
        elif action == "reload":
            old = models.pop(name)
            spawn(name)
            time.sleep(0.05)
            end(old)
        elif action == "kill":
            models[name][0].kill()
            models[name][0].wait()
        print(f"fake tritonserver: {line}", flush=True)
    done = len(lines)
    time.sleep(0.05)
