"""Wait until a job's etcd takes a write: a leader is elected and a majority of its members
answer. ``EmbeddedEtcd`` waits so on this host; a launcher elsewhere (the lab's containers,
whose network only they can reach) runs ``python -m ddp.recovery.etcd.ready`` inside the job's
network with the job's credentials in the environment (``DDP_ETCD_ENDPOINTS`` and
``DDP_ETCD_CREDENTIALS``).

The key written is the job's own health key, outside every job's prefix, so the wait changes
nothing a member reads.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from ddp.recovery.etcd.client import Credentials, Etcd, EtcdError, EtcdUnavailable

__all__ = ["HEALTH_KEY", "wait_ready"]

HEALTH_KEY = "/ddp/healthy"


def wait_ready(
    credentials: Credentials,
    timeout_s: float,
    check: Callable[[], None] = lambda: None,
) -> None:
    """Until a write succeeds. ``check`` runs between tries and raises to give up early (a
    member's process already exited). EtcdUnavailable with the last error after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    client = Etcd(credentials, timeout_s=1.0)
    last: Exception | None = None
    while time.monotonic() < deadline:
        check()
        try:
            client.put(HEALTH_KEY, b"1")
            return
        except EtcdError as err:
            last = err
            time.sleep(0.05)
    raise EtcdUnavailable(f"the etcd cluster had no leader within {timeout_s:g} s ({last})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.etcd.ready", description=__doc__)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds at most (default 30)")
    a = p.parse_args(argv)
    try:
        credentials = Credentials.from_env()
        wait_ready(credentials, a.timeout)
        leader = Etcd(credentials, timeout_s=a.timeout).leader_endpoint()  # for the line only
    except (ValueError, EtcdError) as e:
        print(f"etcd not ready: {e}", file=sys.stderr)
        return 1
    print(f"etcd ready: leader {leader}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
