"""Running tests through ``_worker`` processes with deadlines, surviving hangs and crashes.

A worker runs a list of tests and appends one JSON line per finished test. The driver watches
the results file: if no test finishes within ``per_test_s`` (plus import slack), or the worker
dies, the first test without a line is recorded as ``timeout``/``crash`` and a fresh worker is
started on the rest. Nothing waits without a deadline; a killed worker takes its whole process
group (the test's ranks) with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["ROOT", "run_tests"]

ROOT = Path(__file__).resolve().parents[2]
_IMPORT_SLACK_S = 60.0  # torch + torch's test modules import in ~5-10 s on a loaded 2-core host


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _watch(
    proc: subprocess.Popen,
    results: Path,
    per_test_s: float,
    expected: int,
    on_row: Callable[[dict], None],
) -> tuple[str, str] | None:
    """Wait for the worker, passing each new result row to ``on_row``; None once it has
    finished ``expected`` tests, else why it stopped. Each new row restarts the per-test
    deadline (the first one also covers the imports)."""
    seen = len(_read_rows(results))
    target = seen + expected
    deadline = time.monotonic() + per_test_s + _IMPORT_SLACK_S
    while True:
        exited = proc.poll() is not None  # before reading: a line written at exit is seen
        new = _read_rows(results)[seen:]
        for row in new:
            on_row(row)
        seen += len(new)
        if seen >= target:
            return None
        if exited:
            return ("crash", f"worker exited with code {proc.returncode} during the test")
        if new:
            deadline = time.monotonic() + per_test_s + 30
        if time.monotonic() > deadline:
            return ("timeout", f"no result within {per_test_s + 30:.0f} s (killed with its ranks)")
        time.sleep(0.2)


def run_tests(
    tests: Sequence[str],
    impl: str,
    *,
    world_size: int = 2,
    per_test_s: float = 60.0,
    start: str = "fork",
    progress: Callable[[dict], None] = lambda row: None,
) -> dict[str, dict]:
    """Run ``tests`` with ``impl`` ("torch" or "ours"); test name -> result row (status, reason,
    seconds). ``progress`` is called with each row as it arrives."""
    rows: dict[str, dict] = {}

    def on_row(row: dict) -> None:
        rows[row["test"]] = row
        progress(row)

    with tempfile.TemporaryDirectory(prefix="torch-suite-") as tmp:
        results = Path(tmp) / "results.jsonl"
        while remaining := [t for t in tests if t not in rows]:
            cmd = [
                sys.executable,
                "-m",
                "tests.torch_suite._worker",
                "--impl",
                impl,
                "--results",
                str(results),
                "--world-size",
                str(world_size),
                "--timeout",
                str(int(per_test_s)),
                "--start",
                start,
                *remaining,
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TEMP_DIR": tmp}
            with open(Path(tmp) / "worker.log", "w") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                verdict = _watch(proc, results, per_test_s, len(remaining), on_row)
            finally:  # also on Ctrl-C or SIGTERM: no test's ranks outlive the driver
                _kill_group(proc)
            pending = [t for t in tests if t not in rows]
            if verdict and pending:  # the test it was running when it hung or died
                on_row(
                    {
                        "test": pending[0],
                        "impl": impl,
                        "status": verdict[0],
                        "reason": verdict[1],
                        "seconds": None,
                    }
                )
    return rows
