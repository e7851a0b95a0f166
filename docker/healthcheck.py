"""Container healthcheck: exit 0 when Triton answers /v2/health/ready with 200.

Environment: TRITON_HTTP_PORT (default 8000), HEALTHCHECK_TIMEOUT_S (default 3).
"""
import os
import sys
import urllib.request

PORT = int(os.environ.get("TRITON_HTTP_PORT", "8000"))
TIMEOUT_S = float(os.environ.get("HEALTHCHECK_TIMEOUT_S", "3"))

try:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v2/health/ready", timeout=TIMEOUT_S) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
    print(f"not ready: {exc}", file=sys.stderr)
    sys.exit(1)
