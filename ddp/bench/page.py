"""The bench's ``report.html``: the three targets as the headline, the variants' medians and
the per-round ratios as tables, links to ``bench.json`` and ``bench.csv``. Built from the same
measured medians as the printed report (:mod:`ddp.bench.report`), not from its text."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ddp.bench.report import ratios
from ddp.report import Headline, Link, Page, Section, Table, write_page

__all__ = ["bench_page", "write_bench_page"]

_SHORT = {
    "ours/torch step time": "ours/torch",
    "ours+hook/ours step time": "ours+hook/ours",
    "one node: ours+hierarchical/ours": "ours+hier/ours",
    "world size 1: ours/bare module": "ws1 ours/bare",
}


def _variants(per_round: dict[str, list[float]], caption: str) -> Table:
    rows = []
    for key, values in per_round.items():
        if values:
            variant, batch = key.split("@")
            rows.append([variant, int(batch), statistics.median(values), len(values)])
    return Table(("variant", "batch/rank", "median step ms", "rounds"), rows, caption)


def _headline(found: dict[str, dict[str, Any]], command: str) -> Headline:
    judged = {n: r for n, r in found.items() if r["ratio"] is not None}
    met = [n for n, r in judged.items() if r["met"]]
    figure = ", ".join(f"{_SHORT.get(n, n)} {r['ratio']:.2f}x" for n, r in judged.items())
    verdict = f"targets met: {len(met)} of {len(judged)}"
    if len(judged) < len(found):
        verdict += f" ({len(found) - len(judged)} skipped)"
    return Headline(command, verdict, figure, bool(judged) and len(met) == len(judged))


def bench_page(runs: dict[str, dict[str, Any]], cfg: dict[str, Any], command: str) -> Page:
    found = ratios(runs, cfg["batch"])
    met = {True: "met", False: "NOT met", None: "skipped"}
    rows = [
        [
            n,
            r["ratio"],
            f"<= {r['target']:.2f}",
            met[r["met"]],
            ", ".join(f"{x:.2f}" for x in r["per_round"]),
        ]
        for n, r in found.items()
    ]
    targets = Table(
        ("target", "ratio", "bound", "met", "per round"),
        rows,
        "median of per-round ratios: both sides of a round ran interleaved, step by step",
    )
    sections = [Section("Targets", [targets])]
    for name, run in runs.items():
        label = f"{cfg['world_size']} ranks" if name == "multi" else "world size 1"
        caption = (
            f"{cfg['depth']}x{cfg['width']} MLP, {cfg['rounds']} rounds x "
            f"{cfg['steps']} steps; median of per-round medians"
        )
        blocks = [_variants(run.get("per_round_ms", {}), caption)]
        skipped = run.get("skipped", {})
        if skipped:
            blocks.append(Table(("variant", "skipped because"), list(skipped.items())))
        sections.append(Section(label, blocks))
    links = [
        Link("bench.json", "config, command, per-round medians, ratios"),
        Link("bench.csv", "one row per run, variant, batch and round"),
    ]
    return Page("python -m ddp.bench", _headline(found, command), sections, links)


def write_bench_page(
    out_dir: Path, runs: dict[str, dict[str, Any]], cfg: dict[str, Any], command: str
) -> Path:
    return write_page(bench_page(runs, cfg, command), Path(out_dir))
