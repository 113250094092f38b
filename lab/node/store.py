"""``python -m lab.node.store``: the c10d rendezvous store of a torchrun job with no first node.

With ``docker compose --scale worker=N`` or a swarm service, the workers are interchangeable
replicas: none has a name the others could use as ``--rdzv-endpoint``, and any of them may be
the one that is restarted or lost. So the rendezvous lives in a service of its own: a TCPStore
server on ``--port`` that torchrun's c10d backend uses as its key-value store (every agent is
then a client, ``is_host=false``). It stays up until ``--count`` workers reported their exit
code or ``--timeout`` passes, so nothing outlives the run. An elastic job (torchrun
``--nnodes MIN:MAX``) may lose a worker with its host, which then never reports: with ``--min``
the store closes once ``--min`` workers reported and ``--grace`` seconds passed without the
rest (the survivors of one rendezvous round end within seconds of each other). It then prints
one line with every worker's exit code (torchrun's: 0 when all its workers succeeded, 1 when
one failed past ``--max-restarts``) and exits with the first non-zero one, so that compose and
swarm runs can fail with it. A worker reports either as a file in ``--dir`` (compose: a volume
every worker shares) or through the store itself, ``python -m lab.node.store --report
rdzv:29400 --name NAME --code CODE`` (the swarm stack across hosts: nothing shared but the
network).

The one module of :mod:`lab.node` that needs torch (imported when run; the lab image has it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import timedelta
from pathlib import Path

__all__ = ["main"]

_EXITS, _COUNT = "lab/exits", "lab/exited"  # the workers' reports: "name=code;"..., how many


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.node.store", description=__doc__)
    p.add_argument("--port", type=int, default=29400, help="TCP port (default 29400)")
    p.add_argument("--dir", type=Path, help="where the workers write exit codes, if anywhere")
    p.add_argument("--count", type=int, help="how many workers to wait for")
    p.add_argument("--min", default="", help="enough workers for an elastic job (default --count)")
    p.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="with --min: seconds to wait for the rest once --min reported (default 60)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds at most (default 900)")
    p.add_argument("--report", metavar="HOST:PORT", help="a worker: report to this store")
    p.add_argument("--name", help="--report: the worker's name (e.g. its hostname)")
    p.add_argument("--code", type=int, help="--report: the worker's exit code")
    args = p.parse_args(argv)
    if args.report:
        if args.name is None or args.code is None:
            p.error("--report needs --name and --code")
        return _report(args.report, args.name, args.code)
    if args.count is None or args.count < 1:
        p.error(f"--count must be >= 1, got {args.count}")
    enough = args.count if args.min == "" else int(args.min) if args.min.isdigit() else 0
    if not 1 <= enough <= args.count:  # "": the stack's NNODES_MIN left unset
        p.error(f"--min must be an integer in 1..--count ({args.count}), got {args.min!r}")

    from torch.distributed import TCPStore

    store = TCPStore(
        "0.0.0.0",
        args.port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=args.timeout),
    )
    print(f"rendezvous store listening on port {args.port}", flush=True)
    deadline, last_call = time.monotonic() + args.timeout, math.inf
    while time.monotonic() < deadline:
        codes = _codes(args.dir, store)
        if last_call == math.inf and len(codes) >= enough:
            last_call = time.monotonic() + args.grace
        if len(codes) >= args.count or time.monotonic() >= last_call:
            del store
            return _summary(codes, args.count)
        time.sleep(0.5)
    print(f"store closes after --timeout {args.timeout:g} s", flush=True)
    _summary(_codes(args.dir, store), args.count)
    return 1


def _report(address: str, name: str, code: int) -> int:
    """A worker's exit code into the store: appended as ``name=code;``, then counted."""
    from torch.distributed import TCPStore

    host, _, port = address.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    store.append(_EXITS, f"{name}={code};")
    store.add(_COUNT, 1)
    return 0


def _codes(directory: Path | None, store: object) -> dict[str, int]:
    """Every exit code reported so far: files in ``directory``, and reports to the store."""
    codes = {}
    for path in sorted(directory.glob("*")) if directory and directory.is_dir() else []:
        try:
            codes[path.name] = int(path.read_text().strip())
        except (OSError, ValueError):
            codes[path.name] = 1
    if store.add(_COUNT, 0) > 0:  # type: ignore[attr-defined]
        for item in store.get(_EXITS).decode().split(";"):  # type: ignore[attr-defined]
            name, _, code = item.partition("=")
            if name:
                codes[name] = int(code) if code.lstrip("-").isdigit() else 1
    return codes


def _summary(codes: dict[str, int], count: int) -> int:
    parts = ", ".join(f"{name} {code}" for name, code in codes.items())
    bad = [c for c in codes.values() if c != 0]
    what = "every worker succeeded" if not bad else "a worker failed (see its torchrun error)"
    if not bad and len(codes) < count:
        what = (
            f"every worker that reported succeeded; {count - len(codes)} of {count} never "
            "reported (lost with its host?)"
        )
    print(f"worker exit codes (torchrun's): {parts}: {what}", flush=True)
    return bad[0] if bad and 0 < bad[0] < 256 else (1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
