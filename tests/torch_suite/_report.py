"""The suite's verdict, its table and its JSON: one row per selected test, torch's result beside
ours, and the reason (torch's skip or failure for excluded tests, our refusal or failure)."""

from __future__ import annotations

from collections import Counter

__all__ = ["rows", "table", "verdict_ok"]

_OK = {"pass", "refused"}  # refused: the API is ours to add, not a broken test


def rows(torch_rows: dict[str, dict], ours_rows: dict[str, dict]) -> list[dict]:
    """Merged rows in selection order; ``ours`` is ``-`` where torch's class did not pass. A
    failure keeps the failing rank's traceback (JSON only; the table shows its first line)."""
    out = []
    for test, t in torch_rows.items():
        o = ours_rows.get(test)
        row = {
            "test": test,
            "torch": t["status"],
            "ours": o["status"] if o else "-",
            "reason": (o["reason"] if o else f"excluded: {t['reason']}") or "",
            "seconds": o.get("seconds") if o else None,
        }
        if o and o.get("traceback"):
            row["traceback"] = o["traceback"]
        out.append(row)
    return out


def verdict_ok(merged: list[dict]) -> bool:
    """True iff every baseline test passes with ours or needs an API we refuse."""
    return all(r["ours"] in _OK for r in merged if r["torch"] == "pass")


def table(merged: list[dict], *, baseline_only: bool = False) -> str:
    """The printed table; with ``baseline_only``, the excluded tests are summed up in one line."""
    shown = [r for r in merged if r["torch"] == "pass"] if baseline_only else merged
    width = max([len(r["test"]) for r in shown] + [4])
    lines = [f"{'test':<{width}}  {'torch':<7} {'ours':<8} reason"]
    lines += [f"{r['test']:<{width}}  {r['torch']:<7} {r['ours']:<8} {r['reason']}" for r in shown]
    base = [r for r in merged if r["torch"] == "pass"]
    counts = Counter(r["ours"] for r in base)
    excluded = Counter(r["torch"] for r in merged if r["torch"] != "pass")
    lines.append(
        f"{len(merged)} DDP tests selected; {len(base)} pass with torch's class here (baseline); "
        f"excluded: {', '.join(f'{n} {s}' for s, n in sorted(excluded.items())) or 'none'}"
    )
    lines.append(
        "ours on the baseline: "
        + ", ".join(
            f"{counts[s]} {s}" for s in ("pass", "refused", "fail", "timeout", "crash") if counts[s]
        )
    )
    return "\n".join(lines)
