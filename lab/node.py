"""In-container node launcher: runs this node's ranks as ``python -m ddp train`` processes.

It is the container's main process. It waits for lab's go file (so lab can prepare the node,
e.g. shape its link, before any rank starts), starts one process per rank, prefixes every output
line with ``[nodeN/rankR]``, and reports ``[nodeN/rankR] exit C`` for each rank, so the host sees
per-rank exit codes in one stream. The container exits non-zero if any rank did.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["EXIT_MARK", "main"]

EXIT_MARK = " exit "  # "[node1/rank1] exit 0": the launcher's last line per rank
_GO_MISSING = 3


def _pump(proc: subprocess.Popen, prefix: str, lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"{prefix} {line.rstrip()}\n")
            sys.stdout.flush()


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.node", description=__doc__)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--ranks", required=True, help="comma-separated global ranks, e.g. 2,3")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--go-file", default=None)
    parser.add_argument("--go-timeout", type=float, default=300.0)
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="after --: ddp flags")
    args = parser.parse_args(argv)
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    ranks = [int(r) for r in args.ranks.split(",")]

    if args.go_file and not _wait_for(Path(args.go_file), args.go_timeout):
        print(
            f"[node{args.node}] no go file {args.go_file} after {args.go_timeout:g} s; "
            "the lab that started this node is gone",
            flush=True,
        )
        return _GO_MISSING

    lock = threading.Lock()
    procs: dict[int, subprocess.Popen] = {}
    pumps = []
    # Forward docker stop's SIGTERM so ranks end (and write their logs) instead of being orphaned.
    signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs.values()])
    for rank in ranks:
        cmd = [
            sys.executable,
            "-m",
            "ddp",
            "train",
            "--rank",
            str(rank),
            "--world-size",
            str(args.world_size),
            "--init-method",
            args.init_method,
            "--log-dir",
            args.log_dir,
            *flags,
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        procs[rank] = proc
        pump = threading.Thread(target=_pump, args=(proc, f"[node{args.node}/rank{rank}]", lock))
        pump.start()
        pumps.append(pump)

    worst = 0
    pending = {proc.pid: rank for rank, proc in procs.items()}
    # wait4 instead of Popen.wait: it reports each rank's own CPU time and peak memory, and
    # returns whichever rank ends first, so the host learns of a failure at once.
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        rank = pending.pop(pid, None)
        if rank is None:
            continue  # not a rank (cannot happen: the launcher starts nothing else)
        code = os.waitstatus_to_exitcode(status)
        procs[rank].returncode = code
        pumps[ranks.index(rank)].join()
        cpu_s = usage.ru_utime + usage.ru_stime
        with lock:
            print(
                f"[node{args.node}/rank{rank}]{EXIT_MARK}{code} "
                f"(cpu {cpu_s:.2f} s, peak rss {usage.ru_maxrss / 1024:.0f} MiB)",
                flush=True,
            )
        worst = worst or code
    return 0 if worst == 0 else (worst if 0 < worst < 256 else 1)


if __name__ == "__main__":
    sys.exit(main())
