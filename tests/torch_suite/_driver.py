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
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as tmp:
        results = Path(tmp) / "results.jsonl"
        log = Path(tmp) / "worker.log"
        seen = 0
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
            with open(log, "w") as log_f:
                proc = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=log_f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + per_test_s + _IMPORT_SLACK_S
            verdict = None
            while True:
                new = _read_rows(results)[seen:]
                for row in new:
                    rows[row["test"]] = row
                    progress(row)
                if new:
                    seen += len(new)
                    deadline = time.monotonic() + per_test_s + 30
                if proc.poll() is not None:
                    if proc.returncode != 0 or len(rows) < len(tests):
                        tail = log.read_text().strip().splitlines()[-1:] or [""]
                        verdict = ("crash", f"worker exited {proc.returncode}: {tail[0][:200]}")
                    break
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    verdict = ("timeout", f"no result within {per_test_s + 30:.0f} s (killed)")
                    break
                time.sleep(0.2)
            _kill_group(proc)  # the ranks of a test the worker was running, if any are left
            for row in _read_rows(results)[seen:]:
                rows[row["test"]] = row
                progress(row)
                seen += 1
            pending = [t for t in tests if t not in rows]
            if verdict and pending:
                row = {
                    "test": pending[0],
                    "impl": impl,
                    "status": verdict[0],
                    "reason": verdict[1],
                    "seconds": None,
                }
                rows[pending[0]] = row
                progress(row)
    return rows
