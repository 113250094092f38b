"""``python -m lab.node.store``: the c10d rendezvous store of a torchrun job with no first node.

With ``docker compose --scale worker=N`` or a swarm service, the workers are interchangeable
replicas: none has a name the others could use as ``--rdzv-endpoint``, and any of them may be
the one that is restarted or lost. So the rendezvous lives in a service of its own: a TCPStore
server on ``--port`` that torchrun's c10d backend uses as its key-value store (every agent is
then a client, ``is_host=false``). It stays up until ``--count`` exit files are in ``--dir``
(every worker ended) or ``--timeout`` passes, so nothing outlives the run, and then prints
one line with every worker's exit code (torchrun's: 0 when all its workers succeeded, 1 when
one failed past ``--max-restarts``) and exits with the first non-zero one, so that compose
and swarm runs can fail with it.

The one module of :mod:`lab.node` that needs torch (imported when run; the lab image has it).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.node.store", description=__doc__)
    p.add_argument("--port", type=int, default=29400, help="TCP port (default 29400)")
    p.add_argument("--dir", type=Path, required=True, help="where the workers write exit codes")
    p.add_argument("--count", type=int, required=True, help="how many workers to wait for")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds at most (default 900)")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error(f"--count must be >= 1, got {args.count}")

    from torch.distributed import TCPStore

    store = TCPStore(
        "0.0.0.0", args.port, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=args.timeout),
    )  # fmt: skip
    print(f"rendezvous store listening on port {args.port}", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        done = len(list(args.dir.glob("*"))) if args.dir.is_dir() else 0
        if done >= args.count:
            del store
            return _summary(args.dir)
        time.sleep(0.5)
    print(f"store closes after --timeout {args.timeout:g} s", flush=True)
    _summary(args.dir)
    return 1


def _summary(directory: Path) -> int:
    codes = {}
    for path in sorted(directory.glob("*")):
        try:
            codes[path.name] = int(path.read_text().strip())
        except (OSError, ValueError):
            codes[path.name] = 1
    parts = ", ".join(f"{name} {code}" for name, code in codes.items())
    bad = [c for c in codes.values() if c != 0]
    what = "every worker succeeded" if not bad else "a worker failed (see its torchrun error)"
    print(f"worker exit codes (torchrun's): {parts}: {what}", flush=True)
    return bad[0] if bad and 0 < bad[0] < 256 else (1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
