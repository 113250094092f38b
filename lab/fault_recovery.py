"""Did ``lab kill --recover`` lose anything? Compare the final parameters, bit for bit.

Every rank's last JSON log record is ``{"event": "end", "parity": ..., "params_sha256": ...}``
(sha256 of all parameter bytes), so the resumed run and an uninterrupted run of the same
length and settings are identical iff those digests are equal on every rank. Pure: reads the
collected logs only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Recovery", "compare_runs", "read_run_records"]


def read_run_records(log_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> {"start_step", "end" (the end record or None)} from ``rank<R>.jsonl`` files."""
    runs: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(log_dir).glob("rank*.jsonl")):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m is None:
            continue
        info: dict[str, Any] = {"start_step": None, "end": None, "steps": 0}
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            event = rec.get("event")
            if event == "config":
                info["start_step"] = rec.get("start_step")
            elif event == "step":
                info["steps"] += 1
            elif event == "end":
                info["end"] = rec
        runs[int(m.group(1))] = info
    return runs


@dataclass
class Recovery:
    ok: bool
    last_line: str
    resumed_from: int | None
    details: list[str]


def compare_runs(
    reference: dict[int, dict[str, Any]], resumed: dict[int, dict[str, Any]], world_size: int
) -> Recovery:
    """Bitwise comparison of every rank's final parameters (``params_sha256`` of the end
    records) between the uninterrupted run and the resumed one."""
    details: list[str] = []
    starts = {r["start_step"] for r in resumed.values()}
    resumed_from = starts.pop() if len(starts) == 1 else None
    ref_sha, res_sha = {}, {}
    for name, runs, shas in (("uninterrupted", reference, ref_sha), ("resumed", resumed, res_sha)):
        for rank in range(world_size):
            end = (runs.get(rank) or {}).get("end")
            if end is None or not end.get("params_sha256"):
                details.append(f"the {name} run has no end record for rank {rank}")
            else:
                shas[rank] = end["params_sha256"]
                if not end.get("parity"):
                    details.append(f"the {name} run ended with parity broken (rank {rank})")
    if details:
        return Recovery(
            False, "recovered: cannot compare: " + "; ".join(details), resumed_from, details
        )
    differ = [r for r in range(world_size) if ref_sha[r] != res_sha[r]]
    if not differ:
        return Recovery(
            True,
            "recovered: final parameters bitwise identical to an uninterrupted run",
            resumed_from,
            [f"rank {r} {res_sha[r][:12]}.. = {ref_sha[r][:12]}.." for r in range(world_size)],
        )
    details = [f"rank {r} {res_sha[r][:12]}.. != {ref_sha[r][:12]}.." for r in differ]
    return Recovery(
        False,
        f"recovered but final parameters DIFFER from an uninterrupted run on ranks "
        f"{','.join(map(str, differ))} ({details[0]})",
        resumed_from,
        details,
    )
