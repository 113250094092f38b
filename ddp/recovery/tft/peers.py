"""The start of a torchft run: wait until every replica heartbeats to the lighthouse before
the first quorum, so that the first quorum holds all of them (as our coordinator's first
quorum is every rank of ``--world-size``). Without it, torchft forms a quorum of the replicas
that happen to be up after ``--join_timeout_ms`` (interpreters and torch start at different
speeds on a busy host), and the rest join later and heal: a different job.

torchft 0.2.0's lighthouse has no API that lists its replicas; its status page (``/status``,
what its dashboard polls) says ``[N heartbeating]``, which is read here.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

__all__ = ["heartbeating", "wait_for_replicas"]

_COUNT = re.compile(r"\[(\d+) heartbeating\]")


def heartbeating(lighthouse: str, timeout_s: float = 2.0) -> int | None:
    """How many replicas the lighthouse at ``HOST:PORT`` hears from (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{lighthouse}/status", timeout=timeout_s) as f:
            m = _COUNT.search(f.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError):
        return None
    return int(m.group(1)) if m else None


def wait_for_replicas(lighthouse: str, world: int, timeout_s: float) -> None:
    """Until ``world`` replicas heartbeat; TimeoutError saying how many did."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = heartbeating(lighthouse)
        if seen is not None and seen >= world:
            return
        time.sleep(0.05)
    raise TimeoutError(
        f"only {seen} of {world} replicas reached torchft's lighthouse at {lighthouse} "
        f"within {timeout_s:g} s"
    )
