"""``python -m tests.torch_suite._worker``: run a list of torch DDP tests in one process, one
JSON line per finished test (appended and flushed at once, so a driver that has to kill a hung
worker knows which test hung and can restart with the rest).

    python -m tests.torch_suite._worker --impl ours --results out.jsonl test_ddp_namedtuple ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unittest
from collections.abc import Sequence

__all__ = ["main"]


def _verdict(case: object, result: unittest.TestResult) -> dict[str, object]:
    if result.skipped:
        return {"status": "skip", "reason": f"skipped by torch: {result.skipped[0][1]}"[:300]}
    if result.expectedFailures:
        return {"status": "skip", "reason": "expected failure in torch's suite"}
    problems = result.errors + result.failures
    if not problems:
        return {"status": "pass", "reason": ""}
    outcomes = sorted(getattr(case, "outcomes", []), key=lambda o: o["time"])
    refused = [o for o in outcomes if o["status"] == "refused"]
    if refused:  # other ranks' errors are then usually the refusing rank going away
        apis = sorted({str(o["api"]) for o in refused})
        return {"status": "refused", "apis": apis, "reason": "needs API: " + ", ".join(apis)}
    if outcomes:  # the first rank to fail in time is the likeliest cause
        first = outcomes[0]
        return {
            "status": "fail",
            "reason": f"rank {first['rank']}: {first['reason']}",
            "traceback": first.get("traceback", ""),
        }
    text = problems[0][1].strip().splitlines()
    return {
        "status": "fail",
        "reason": (text[-1] if text else "failed")[:300],
        "traceback": problems[0][1][-4000:],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torch_suite._worker")
    p.add_argument("--impl", choices=("torch", "ours"), required=True)
    p.add_argument("--results", required=True, help="JSON lines file to append to")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--timeout", type=int, default=60, help="per test, seconds")
    p.add_argument("--start", choices=("fork", "spawn"), default="fork")
    p.add_argument("tests", nargs="+")
    args = p.parse_args(argv)
    os.environ.update(
        BACKEND="gloo",
        WORLD_SIZE=str(args.world_size),
        TEMP_DIR=os.environ.get("TEMP_DIR", "/tmp"),  # read at import; each test makes its own
        TORCH_SUITE_IMPL=args.impl,
        TORCH_SUITE_START=args.start,
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.timeout),
        OMP_NUM_THREADS="1",
    )
    from tests.torch_suite._case import case_for

    with open(args.results, "a") as out:
        for name in args.tests:
            t0 = time.monotonic()
            case = case_for(name)
            result = unittest.TestResult()
            unittest.TestSuite([case]).run(result)
            row = {"test": name, "impl": args.impl, **_verdict(case, result)}
            row["seconds"] = round(time.monotonic() - t0, 2)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{name} [{args.impl}]: {row['status']} in {row['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
