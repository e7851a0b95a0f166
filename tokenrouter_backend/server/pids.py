"""The processes of one tritonserver, read from /proc: its process group, its Python stubs
and the model each serves; killing a group and waiting until it is gone; its shared memory.

Pure functions of pids, shared by `TritonServer` (``process.py``) and the container
watchdog (``stub_watch.py``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1              # linux/prctl.h
KILL_POLL_S = 0.25
SHM_DIR = Path("/dev/shm")


def process_group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
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


# A Python-backend stub's argv after ``<repository>/<model>/<version>/model.py``: shm region,
# default size, growth size, parent pid, backend dir, IPC handle, then the stub's name (the
# model instance's, e.g. ``heavy_0_0``; the bare model name for the short-lived stub that
# runs a model's ``auto_complete_config`` while it loads).
STUB_NAME_AFTER_SCRIPT = 7


def _stub_argv(pid: int) -> tuple[str, str | None]:
    """(model, stub name) of a stub; ("?", None) when its argv cannot be read."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?", None
    at = next((i for i, arg in enumerate(argv) if arg.endswith(b".py")), None)
    if at is None:
        return "?", None
    model = Path(argv[at].decode(errors="replace")).parent.parent.name
    name_at = at + STUB_NAME_AFTER_SCRIPT
    return model, argv[name_at].decode(errors="replace") if name_at < len(argv) else None


def stub_model(pid: int) -> str:
    """The model a Python-backend stub serves: its argv names ``<repository>/<model>/<version>/model.py``."""
    return _stub_argv(pid)[0]


def server_stubs(server_pid: int) -> dict[int, str]:
    """The model-instance stubs of a server that leads its own process group: pid -> model.

    Left out: the stub a model load runs for ``auto_complete_config`` (named after the model
    itself, not an instance), which ends by design once the config is complete, and any
    process whose argv is not a stub's: a child Triton forked and has not yet exec'd (it
    still carries tritonserver's argv) or one whose argv cannot be read any more.
    """
    stubs = {}
    for pid in process_group_pids(server_pid):
        if pid == server_pid:
            continue
        model, name = _stub_argv(pid)
        if name is not None and name != model:
            stubs[pid] = model
    return stubs


def pid_alive(pid: int) -> bool:
    """A live, non-zombie process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, OSError):
        return False


def lost_pids(pids) -> list[int]:
    """The pids of ``pids`` that are gone (or zombies), sorted."""
    return sorted(pid for pid in pids if not pid_alive(pid))


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group (gone already: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group_gone(pgid: int, timeout_s: float) -> None:
    """SIGKILL the group until none of its processes is left, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process_group_pids(pgid) and time.monotonic() < deadline:
        kill_group(pgid)
        time.sleep(KILL_POLL_S)


def terminate_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launching thread dies (Linux prctl).

    The server runs in its own session, so without this a launcher killed with SIGKILL
    would leave tritonserver running.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: stopping the server stays the only way
        pass


def remove_shm_regions(prefix: str | None) -> int:
    """Unlink the shared-memory files of one stopped server (names start with its unique prefix)."""
    if not prefix or not SHM_DIR.is_dir():
        return 0
    removed = 0
    for path in SHM_DIR.glob(prefix + "*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed
