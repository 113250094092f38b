"""The launcher of one node's ranks: ``python -m lab.node --node N --ranks JSON [--timeout S]``.

The host execs it into a node container for every job. It starts one process per rank (the
argv the host built, e.g. ``python -m ddp train ...``), prefixes each output line with
``[nodeN/rankR]``, and ends each rank with an exit record carrying the exit code and the
process's own CPU time and peak memory (see :mod:`lab.node.protocol`). ``--timeout`` bounds the
ranks' life: past it they are terminated and report exit code 124, like ``timeout(1)``, so a
host that died cannot leave ranks running. The launcher exits non-zero if any rank did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from lab.node.protocol import ExitRecord, format_line

__all__ = ["main"]

TIMED_OUT = 124  # as timeout(1)
_KILL_AFTER_S = 10.0  # from SIGTERM to SIGKILL for a rank that ignores it


def _pump(proc: subprocess.Popen, node: int, rank: int, lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            sys.stdout.write(format_line(node, rank, line.rstrip("\n")) + "\n")
            sys.stdout.flush()


def _parse_ranks(text: str) -> dict[int, list[str]]:
    data = json.loads(text)
    if not isinstance(data, dict) or not data:
        raise ValueError("--ranks must be a JSON object mapping rank to argv")
    ranks = {int(r): argv for r, argv in data.items()}
    for rank, argv in ranks.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"--ranks: rank {rank}'s argv must be a non-empty list of strings")
    return ranks


class _Ranks:
    """The rank processes and which of them were reaped. Signals go by pid under the lock,
    never through ``Popen.poll``/``terminate``: those reap the child themselves, and the main
    loop's ``wait4(-1)`` would then wait forever for a rank that is already gone."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}
        self.reaped: set[int] = set()
        self.timed_out: set[int] = set()
        self.lock = threading.Lock()

    def signal(self, sig: int, mark_timed_out: bool = False) -> None:
        with self.lock:
            for rank, proc in self.procs.items():
                if rank not in self.reaped:
                    if mark_timed_out:
                        self.timed_out.add(rank)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, sig)

    def expire(self) -> None:
        """The deadline passed: terminate every rank still running, later kill the stubborn."""
        self.signal(signal.SIGTERM, mark_timed_out=True)
        time.sleep(_KILL_AFTER_S)
        self.signal(signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.node", description=__doc__)
    parser.add_argument("--node", type=int, required=True, help="this node's index")
    parser.add_argument("--ranks", required=True, help='JSON: {"<rank>": [argv...], ...}')
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    args = parser.parse_args(argv)
    try:
        ranks = _parse_ranks(args.ranks)
    except ValueError as e:  # json.JSONDecodeError included
        parser.error(str(e))

    out_lock = threading.Lock()
    state = _Ranks()
    pumps: dict[int, threading.Thread] = {}
    # Forward SIGTERM (docker stop) so ranks end and write their logs instead of being orphaned.
    signal.signal(signal.SIGTERM, lambda *_: state.signal(signal.SIGTERM))
    with state.lock:
        for rank, rank_argv in sorted(ranks.items()):
            proc = subprocess.Popen(
                rank_argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            state.procs[rank] = proc
            pumps[rank] = threading.Thread(target=_pump, args=(proc, args.node, rank, out_lock))
            pumps[rank].start()
    timer = threading.Timer(args.timeout, state.expire)
    timer.daemon = True
    timer.start()

    worst = 0
    pending = {proc.pid: rank for rank, proc in state.procs.items()}
    # wait4 instead of Popen.wait: it reports each rank's own CPU time and peak memory, and
    # returns whichever rank ends first, so the host learns of a failure at once.
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        rank = pending.pop(pid, None)
        if rank is None:
            continue  # not a rank (cannot happen: the launcher starts nothing else)
        with state.lock:
            state.reaped.add(rank)
            timed_out = rank in state.timed_out
        code = TIMED_OUT if timed_out else os.waitstatus_to_exitcode(status)
        state.procs[rank].returncode = code
        pumps[rank].join()  # the rank's last lines come before its exit record
        record = ExitRecord(
            code, round(usage.ru_utime + usage.ru_stime, 3), round(usage.ru_maxrss / 1024, 1)
        )
        with out_lock:
            print(format_line(args.node, rank, record.body()), flush=True)
        worst = worst or code
    timer.cancel()
    return 0 if worst == 0 else (worst if 0 < worst < 256 else 1)
