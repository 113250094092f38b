"""``lab run``'s files: ``report.json`` (the plan, every step, the faults, the exits, the
diagnosis), ``steps.png`` (step time per rank over time, the faults marked; bytes on the link
per step below) and the TensorBoard scalars ``tb/job/``, each from the run's summary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ddp.torchfree import tensorboard_available
from lab.experiments.run.analysis import RunSummary

__all__ = ["FIGURE", "write_files", "write_scalars"]

FIGURE = "steps.png"


def _plot(summary: RunSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = summary.result
    t0 = result.started
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, sharex=True)
    for rank, steps in sorted(summary.per_rank.items()):
        steps = sorted(steps, key=lambda s: s.step)
        top.plot([s.t - t0 for s in steps], [s.step_ms for s in steps], ".-", ms=3, lw=0.8,
                 label=f"rank {rank}")  # fmt: skip
    for f in result.faults:
        for ax in (top, bottom):
            ax.axvline(f.at_s, color="red", ls="--", lw=0.8)
        top.annotate(f.text[:40], (f.at_s, 0), rotation=90, fontsize=7, color="red",
                     xytext=(2, 2), textcoords="offset points", va="bottom")  # fmt: skip
    top.set_ylabel("step time (ms)")
    top.set_title(summary.headline()[:110], fontsize=9)
    if summary.per_rank:
        top.legend(fontsize=7, ncol=4)
    lead = {s.step: s.t - t0 for s in summary.per_rank.get(0, [])}
    xs = [lead[k] for k in sorted(summary.step_bytes) if k in lead]
    ys = [summary.step_bytes[k] / 1e6 for k in sorted(summary.step_bytes) if k in lead]
    bottom.plot(xs, ys, ".-", color="C7", ms=3, lw=0.8)
    bottom.set_ylabel("MB on the link per step\n(eth0 tx, all nodes)")
    bottom.set_xlabel("seconds from the job's start")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_scalars(summary: RunSummary, folder: Path) -> Path | None:
    """Step time per rank and bytes per step as TensorBoard scalars; None without tensorboard
    or without a step."""
    if not tensorboard_available() or not summary.per_rank:
        return None
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    try:
        for rank, steps in summary.per_rank.items():
            for s in steps:
                writer.add_scalar(f"step_ms/rank{rank}", s.step_ms, global_step=s.step)
        for step, nbytes in summary.step_bytes.items():
            writer.add_scalar("link_mb_per_step", nbytes / 1e6, global_step=step)
    finally:
        writer.close()
    return folder


def write_files(summary: RunSummary) -> list[Path]:
    result, plan = summary.result, summary.result.plan
    run_dir = Path(result.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "run_id": result.run_id,
        "ok": summary.ok,
        "seconds": round(result.seconds, 3),
        "headline": summary.headline(),
        "diagnosis": result.diagnosis,
        "plan": {
            "command": list(plan.command),
            "workdir": str(plan.workdir),
            "nodes": plan.nodes,
            "ranks_per_node": plan.ranks_per_node,
            "link": plan.link_text(),
            "faults": [c.text for c in plan.faults],
            "hang_after_s": plan.hang_after_s,
            "instrument": plan.instrument,
            "image": result.image,
        },
        "links": result.links,
        "faults": [asdict(f) for f in result.faults],
        "exit_codes": {str(n): c for n, c in sorted(result.exits.items())},
        "running": result.running,
        "median_step_ms": summary.median_ms,
        "p90_step_ms": summary.p90_ms,
        "mb_per_step": summary.mb_per_step,
        "replicas_identical": summary.identical,
        "digests": {str(r): d for r, d in sorted(result.digests.items())},
        "steps": [asdict(s) for s in result.steps],
        "link_bytes_per_step": {str(k): v for k, v in sorted(summary.step_bytes.items())},
    }
    path = run_dir / "report.json"
    path.write_text(json.dumps(data, indent=2))
    written = [path]
    if summary.per_rank:
        _plot(summary, run_dir / FIGURE)
        written.append(run_dir / FIGURE)
    return written
