"""Container watchdog: run tritonserver, and end the container when a Python stub dies.

    python3 -m tokenrouter_backend.server.stub_watch [--poll-s 2] [--ready-timeout-s 0] \\
        -- tritonserver ARGS...

Triton 2.51 keeps answering ``/v2/health/ready`` 200 while a model whose Python stub died
(SIGKILL, the OOM killer) fails every request, so a container's health check never notices.
This runs the command in its own process group, forwards SIGTERM / SIGINT to it (Triton's
graceful stop, ``--exit-timeout-secs``), waits until ``/v2/health/ready`` answers 200 on the
command's HTTP port, records the stubs alive then, adopts stubs that appear later (models
loaded over the API) and, when a recorded stub is gone, logs which model's stub died, stops
tritonserver (SIGTERM; SIGKILL of the group after ``--exit-timeout-secs`` + 10 s), removes
its shared-memory regions and exits with `EXIT_STUB_LOST`, so the container's restart policy
starts a fresh server. A stub that goes because its model was unloaded (the model is no
longer known to Triton) or reloaded (a newer stub of that model appeared) does not count.

Exit codes: tritonserver's own when it exits by itself or after a forwarded signal (128+N
when signal N ended it), `EXIT_STUB_LOST` (3) when a stub died, `EXIT_NOT_READY` (4) when
``--ready-timeout-s`` passed first, `EXIT_USAGE` (2) for bad arguments.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.parse

from tokenrouter_backend.server.pids import (
    kill_group,
    remove_shm_regions,
    server_stubs,
    terminate_with_parent,
    wait_group_gone,
)
from tokenrouter_backend.server.probe import http_status
from tokenrouter_backend.server.stub_set import DIED, RELOADED, UNLOADED, StubSet
from tokenrouter_backend.server.stub_watch_args import EXIT_USAGE, WatchOptions, parse_args

EXIT_STUB_LOST = 3
EXIT_NOT_READY = 4
STOP_EXTRA_GRACE_S = 10.0   # after Triton's --exit-timeout-secs, before SIGKILL of the group
PROBE_TIMEOUT_S = 2.0
PREFIX = "stub_watch: "


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class StubWatch:
    """One watched tritonserver (see the module docstring)."""

    def __init__(self, options: WatchOptions, out=None):
        self.options = options
        self.out = out or sys.stderr
        self.proc: subprocess.Popen | None = None
        self.stubs = StubSet({})
        self._signal: int | None = None
        self._wake = threading.Event()

    def log(self, message: str) -> None:
        print(PREFIX + message, file=self.out, flush=True)

    def run(self) -> int:
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.proc = subprocess.Popen(self.options.command, stdin=subprocess.DEVNULL,
                                         start_new_session=True,  # stubs die with the group
                                         preexec_fn=terminate_with_parent)
        except OSError as err:
            self.log(f"cannot start {self.options.command[0]}: {err}")
            return EXIT_USAGE
        try:
            return self._watch()
        finally:
            self.stop()
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def _on_signal(self, signum: int, _frame) -> None:
        """Forward the stop; no printing here (a handler may interrupt a print)."""
        if self._signal is not None:  # a second signal: no more grace
            if self.proc is not None:
                kill_group(self.proc.pid)
        else:
            self._signal = signum
            self._terminate()
        self._wake.set()

    def _watch(self) -> int:
        opts = self.options
        deadline = time.monotonic() + opts.ready_timeout_s if opts.ready_timeout_s > 0 else None
        ready = False
        while True:
            if self._signal is not None:
                self.log(f"{signal_name(self._signal)}: stopping tritonserver (SIGTERM, --exit-timeout-secs "
                         f"{opts.exit_timeout_s}; a second signal kills it at once)")
                code = self.stop()
                self.log(f"tritonserver stopped with code {code}; exit {exit_code(code)}")
                return exit_code(code)
            code = self.proc.poll()
            if code is not None:
                how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
                self.log(f"tritonserver {how}; exit {exit_code(code)}")
                return exit_code(code)
            if not ready:
                if http_status(opts.http_url + "/v2/health/ready", PROBE_TIMEOUT_S) == 200:
                    ready = True
                    self.stubs = StubSet(server_stubs(self.proc.pid))
                    self.log(f"tritonserver ready; watching {len(self.stubs.stubs)} Python stubs: "
                             + (", ".join(f"{model} (pid {pid})" for pid, model in sorted(self.stubs.names().items()))
                                or "none"))
                elif deadline is not None and time.monotonic() > deadline:
                    self.log(f"tritonserver not ready after --ready-timeout-s {opts.ready_timeout_s:g}; stopping it")
                    self.stop()
                    return EXIT_NOT_READY
            else:
                dead = self.check_stubs()
                if dead:
                    names = ", ".join(f"model '{model}' (pid {pid})" for pid, model in dead)
                    self.log(f"Python stub died: {names}; Triton would keep answering ready while that "
                             f"model fails every request: stopping tritonserver, exit {EXIT_STUB_LOST}")
                    self.stop()
                    return EXIT_STUB_LOST
            self._wake.wait(opts.poll_s)

    def check_stubs(self) -> list[tuple[int, str]]:
        """Adopt new stubs; return the (pid, model) of recorded stubs that died."""
        dead = []
        for change in self.stubs.follow(server_stubs(self.proc.pid), self._model_status):
            if change.gone is None:
                self.log(f"adopted a new Python stub: model '{change.model}' (pid {change.pid})")
            elif change.gone == RELOADED:
                self.log(f"stub of model '{change.model}' (pid {change.pid}) replaced by a newer one (reload)")
            elif change.gone == UNLOADED:
                self.log(f"stub of model '{change.model}' (pid {change.pid}) gone with its model (unloaded)")
            elif change.gone == DIED:
                dead.append((change.pid, change.model))
        return dead

    def _model_status(self, model: str) -> int | None:
        url = f"{self.options.http_url}/v2/models/{urllib.parse.quote(model, safe='')}/ready"
        return http_status(url, PROBE_TIMEOUT_S)

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        """SIGTERM, wait Triton's exit timeout + STOP_EXTRA_GRACE_S, SIGKILL the group, remove
        its shared-memory regions. Returns tritonserver's return code."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            self._terminate()
            grace = self.options.exit_timeout_s + STOP_EXTRA_GRACE_S
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.log(f"tritonserver still running {grace:g} s after SIGTERM: SIGKILL")
        kill_group(proc.pid)  # stubs a crashed server left behind
        code = proc.wait()
        wait_group_gone(proc.pid, STOP_EXTRA_GRACE_S)
        remove_shm_regions(self.options.shm_prefix)
        return code


def main(argv: list[str] | None = None) -> int:
    return StubWatch(parse_args(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
