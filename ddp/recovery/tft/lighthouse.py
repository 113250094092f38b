"""``python -m ddp.recovery.tft.lighthouse``: torchft's lighthouse (its Rust server, shipped in
the torchft wheel as ``torchft_lighthouse``), started through this module so that the driver
and a lab container find it beside their interpreter.

    python -m ddp.recovery.tft.lighthouse --port 29510 --min-replicas 2

``--join-timeout-ms`` defaults to 1000 here (torchft's own default is 60000: a quorum waits a
minute for a replica that stopped heartbeating less than ``--heartbeat-timeout-ms`` ago, so a
SIGKILLed replica would hold its survivors for that long); the other settings are torchft's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

__all__ = ["lighthouse_argv", "main"]


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
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.tft.lighthouse", description=__doc__)
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


if __name__ == "__main__":
    sys.exit(main())
