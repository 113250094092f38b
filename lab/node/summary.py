"""``python -m lab.node.summary``: the last word of a compose run, every node's exit code.

Each compose node writes its exit code to ``DIR/<node>`` when ddp ends; this waits (bounded)
until every node has, prints one line, ``node exit codes: node0 0, node1 3, ...: a peer died,
stalled or never joined``, and exits with the first non-zero code, so that compose, which
returns non-zero only when a dependency fails, can be made to fail with it. A node that died
with its container writes nothing and is reported as ``?``. Standard library only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["MEANING", "main", "summary_line"]

# ddp's exit codes (python -m ddp train --help)
MEANING = {
    0: "parity holds",
    1: "parity broken",
    2: "bad input",
    3: "a peer died, stalled or never joined",
    4: "internal error (traceback in the node's log)",
    5: "live recovery lost its control plane (the job's etcd)",
}


def summary_line(codes: dict[str, int | None]) -> tuple[str, int]:
    """The line and the exit code for ``codes`` (node -> exit code, None when unknown)."""
    parts = ", ".join(f"{n} {'?' if c is None else c}" for n, c in codes.items())
    bad = [c for c in codes.values() if c != 0]
    if not bad:
        return f"node exit codes: {parts}: {MEANING[0]}", 0
    first = next((c for c in bad if c is not None), None)
    if first is None:
        return f"node exit codes: {parts}: nodes without an exit code died with their container", 1
    return f"node exit codes: {parts}: {MEANING.get(first, 'failed')}", first if first < 256 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.node.summary", description=__doc__)
    p.add_argument("--dir", type=Path, required=True, help="where the nodes write their codes")
    p.add_argument("--nodes", required=True, help="comma-separated node names")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    args = p.parse_args(argv)
    nodes = args.nodes.split(",")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not all((args.dir / n).exists() for n in nodes):
        time.sleep(0.2)
    codes: dict[str, int | None] = {}
    for n in nodes:
        try:
            codes[n] = int((args.dir / n).read_text().strip())
        except (OSError, ValueError):
            codes[n] = None
    line, code = summary_line(codes)
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
