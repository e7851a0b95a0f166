"""HTTP health probes that never raise: any failure means "not ready yet".

A probe runs while the server starts: refused connections, resets, timeouts, and answers
that are not HTTP at all (``http.client.BadStatusLine`` and the other
``http.client.HTTPException`` subclasses, e.g. when something else answers on the port)
all return ``None`` instead of ending the caller's wait with a traceback.
"""
from __future__ import annotations

import http.client
import urllib.error
import urllib.request

PROBE_FAILURES = (urllib.error.URLError, http.client.HTTPException, OSError, ValueError)


def http_status(url: str, timeout_s: float) -> int | None:
    """The HTTP status of GET ``url``, or ``None`` when there is no valid HTTP answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        code = err.code
        err.close()
        return code
    except PROBE_FAILURES:
        return None
