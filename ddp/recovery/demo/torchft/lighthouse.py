"""torchft's lighthouse: ``python -m ddp.recovery.demo.torchft.lighthouse`` starts it (its Rust
server, shipped in the torchft wheel as ``torchft_lighthouse``, found beside this interpreter so
that the driver and a lab container start it alike), ``TorchftJob`` starts it in a local run in
place of our coordinator, and ``wait_for_replicas`` holds a replica until every replica heartbeats
to it.

    python -m ddp.recovery.demo.torchft.lighthouse --port 29510 --min-replicas 2

``--join-timeout-ms`` defaults to 1000 here (torchft's own default is 60000: a quorum waits a
minute for a replica that stopped heartbeating less than ``--heartbeat-timeout-ms`` ago, so a
SIGKILLed replica would hold its survivors for that long); the other settings are torchft's.

Waiting for every replica before the first quorum makes that quorum hold all of them (as our
coordinator's first quorum is every rank of ``--world-size``). Without it, torchft forms a
quorum of the replicas that happen to be up after ``--join_timeout_ms`` (interpreters and torch
start at different speeds on a busy host), and the rest join later and heal: a different job.
torchft 0.2.0's lighthouse has no API that lists its replicas; its status page (``/status``,
what its dashboard polls) says ``[N heartbeating]``, which is read here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ddp.recovery.harness.local import LocalJob

__all__ = ["TorchftJob", "heartbeating", "lighthouse_argv", "main", "wait_for_replicas"]


def lighthouse_argv(port: int, min_replicas: int, join_timeout_ms: int = 1000) -> list[str]:
    """The lighthouse's own flags for these settings."""
    return [
        "--bind",
        f"[::]:{port}",
        "--min_replicas",
        str(min_replicas),
        "--join_timeout_ms",
        str(join_timeout_ms),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ddp.recovery.demo.torchft.lighthouse", description=__doc__
    )
    p.add_argument("--port", type=int, default=29510, help="port to listen on (default 29510)")
    p.add_argument("--min-replicas", type=int, required=True, help="smallest quorum allowed")
    p.add_argument(
        "--join-timeout-ms",
        type=int,
        default=1000,
        help="how long a quorum waits for a replica that may still be alive (default 1000)",
    )
    args = p.parse_args(argv)
    if args.min_replicas < 1 or not 0 < args.port < 65536 or args.join_timeout_ms < 0:
        p.error("need --min-replicas >= 1, --port in 1..65535 and --join-timeout-ms >= 0")
    os.environ.setdefault("RUST_LOG", "warn")  # not a line per quorum
    script = _script()
    if script is None:
        p.error("torchft is not installed: pip install -c constraints.txt -e '.[torchft]'")
    # The wheel's script, not its function: the function parses the interpreter's own
    # command line, which under python -m is not the lighthouse's.
    os.execv(script, [script, *lighthouse_argv(args.port, args.min_replicas, args.join_timeout_ms)])
    return 0  # not reached


def _script() -> str | None:
    """torchft's ``torchft_lighthouse``: beside this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    return str(beside) if beside.is_file() else shutil.which("torchft_lighthouse")


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


class TorchftJob(LocalJob):
    """The lighthouse and the replica processes of one local torchft run."""

    def start_server(self) -> None:
        self.rank_cfg = self.rank_cfg.replace(coordinator=f"127.0.0.1:{self.port}")
        least = (self.world + 1) // 2  # a quorum of fewer than half is refused, as ours does
        self._start(
            "coordinator",
            "-m",
            "ddp.recovery.demo.torchft.lighthouse",
            "--port",
            str(self.port),
            "--min-replicas",
            str(least),
        )


if __name__ == "__main__":
    sys.exit(main())
