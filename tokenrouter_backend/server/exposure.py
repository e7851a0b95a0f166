"""`serve`'s loud warning when it listens beyond loopback with a tritonserver that carries known CVEs.

The nvidia-pytriton wheel's tritonserver is 2.51; NVIDIA's August 2025 bulletin fixed five
vulnerabilities in 2.59.1 (Triton 25.07), and later bulletins fixed more in later releases
(docs/security.md, "Triton versions"). ``server_version`` asks the running server (``/v2``);
``exposure_warning`` is the text `serve` prints to stderr and appends to the server's log.
"""
from __future__ import annotations

import ipaddress
import json
import urllib.request

from tokenrouter_backend.server.probe import PROBE_FAILURES

FIXED_IN = (2, 59, 1)  # Triton 25.07: the August 2025 bulletin's fixes
AUGUST_2025_CVES = {
    "CVE-2025-23310": "HTTP chunked-encoding stack overflow (remote, unauthenticated)",
    "CVE-2025-23311": "HTTP chunked-encoding stack overflow (remote, unauthenticated)",
    "CVE-2025-23319": "Python backend: shared-memory region name disclosed",
    "CVE-2025-23320": "Python backend: shared-memory registration of that region",
    "CVE-2025-23334": "Python backend: out-of-bounds access through it (chain to code execution)",
}


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for 0.0.0.0, ::, any other address or name."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def server_version(http_url: str, timeout_s: float = 5.0) -> str | None:
    """tritonserver's version from its ``/v2`` metadata (None when it does not say)."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2", timeout=timeout_s) as resp:
            return str(json.loads(resp.read()).get("version"))
    except (*PROBE_FAILURES, json.JSONDecodeError, AttributeError):
        return None


def _parsed(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in version.split(".")[:3])
    except ValueError:
        return None


def exposure_warning(address: str, version: str | None, door_limit: int | None) -> str | None:
    """The warning for listening on ``address`` with tritonserver ``version`` (None: no warning
    needed). ``door_limit``: the door's limit in bytes, or None when serve runs without it."""
    parsed = _parsed(version) if version else None
    if is_loopback(address) or (parsed is not None and parsed >= FIXED_IN):
        return None
    cves = "\n".join(f"    {cve}: {what}" for cve, what in AUGUST_2025_CVES.items())
    door = (f"The door in front of it refuses any request over {door_limit} bytes and sends tritonserver "
            "no chunked body, and the shared-memory API needs the admin key; the rest is reachable "
            "by anyone who can connect."
            if door_limit is not None else
            "--no-door: nothing stands between the network and tritonserver's HTTP parser.")
    return (f"WARNING: tokenrouter serve listens on {address}, beyond loopback, with tritonserver "
            f"{version or '(version unknown)'}, which carries these vulnerabilities fixed in Triton 25.07 "
            f"(2.59.1) and later:\n{cves}\n  and the fixes of NVIDIA's later bulletins "
            f"(docs/security.md, \"Triton versions\").\n  {door}\n"
            "  Bind 127.0.0.1 unless every client network is trusted; for production use the "
            "container images (docs/deployment.md).")
