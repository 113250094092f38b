"""``python -m tests.torch_suite``: torch's own gloo/CPU DDP tests against ``ddp``'s class.

Prints one line per test as it finishes, then the table (test, result with torch's class,
result with ours, reason) and writes it as JSON. Exit code 0 iff every test that passes with
torch's class here passes with ours or needs an API we refuse (``refused``: see
``tests/torch_suite/_classify.py`` for how a refusal is recognised); 1 otherwise.

    python -m tests.torch_suite                      # ~1 min on 2 cores, stored baseline
    python -m tests.torch_suite --rebaseline         # also re-run all with torch's class
    python -m tests.torch_suite test_ddp_create_graph DdpComparisonTest.test_ddp_comparison
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.torch_suite._report import table
from tests.torch_suite._suite import run_suite

__all__ = ["main"]


def _progress(row: dict) -> None:
    secs = "" if row.get("seconds") is None else f" in {row['seconds']:.1f} s"
    print(f"  [{row['impl']:>5}] {row['test']}: {row['status']}{secs}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.torch_suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("tests", nargs="*", help="test ids (default: every selected DDP test)")
    p.add_argument(
        "--out", default="runs/torch-suite.json", help="JSON report path (default: %(default)s)"
    )
    p.add_argument(
        "--rebaseline",
        action="store_true",
        help="re-run every test with torch's class and store tests/torch_suite/"
        "baseline.json (about +1 min)",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks per test (default: 2)")
    p.add_argument(
        "--per-test-timeout",
        type=float,
        default=60.0,
        help="seconds per test before it is killed (default: %(default)s)",
    )
    p.add_argument(
        "--start",
        choices=("fork", "spawn"),
        default="fork",
        help="how ranks start (default: fork; spawn is torch's way, ~5x slower)",
    )
    p.add_argument("--all", action="store_true", help="print excluded tests in the table too")
    args = p.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) as an exception, so the driver's cleanup kills the ranks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run_suite(
        args.tests,
        rebaseline=args.rebaseline,
        world_size=args.world_size,
        per_test_s=args.per_test_timeout,
        start=args.start,
        progress=_progress,
    )
    print(table(report["rows"], baseline_only=not args.all))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    verdict = "OK" if report["ok"] else "FAIL: a test that needs only supported API fails"
    print(
        f"{verdict}; {report['seconds']:.1f} s (baseline: {report['baseline_from']}); wrote {out}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
