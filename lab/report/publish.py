"""Where a run's results land: ``report.html``, ``summary.json`` and the TensorBoard scalars
``tb/<job>/`` of every training job, in ``runs/<run-id>/``.

The scalars are written here, on the host, after the run, from the ranks' step records the
lab collected: the containers stay lean (nothing new in the image) and every job's folder is a
sibling, so ``tensorboard --logdir runs/<run-id>/tb`` overlays a sweep's configurations.
Without tensorboard installed the run goes on and one line says how to get them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ddp.torchfree import TB_MISSING, Link, Page, tensorboard_available, write_page, write_scalars
from lab.report.common import job_logs
from lab.report.summary import RunSummary, write_summary

__all__ = ["TB_DIR", "publish", "write_job_scalars"]

TB_DIR = "tb"


def write_job_scalars(run_dir: Path, jobs: Sequence[str]) -> list[str]:
    """``tb/<job>/`` for every job with step records; the jobs written."""
    done = []
    for job in jobs:
        logs, _ = job_logs(run_dir, job)
        if logs and write_scalars(Path(run_dir) / TB_DIR / job, logs) is not None:
            done.append(job)
    return done


def _links(run_dir: Path, files: Sequence[tuple[str, str]], jobs: Sequence[str]) -> list[Link]:
    links = [Link(name, note) for name, note in files]
    for job in jobs:
        if (Path(run_dir) / job).is_dir():
            links.append(Link(f"{job}/logs/", f"job {job}: rank<R>.jsonl, the typed records"))
            links += [
                Link(f"{job}/{p.name}", "a node's output")
                for p in sorted((Path(run_dir) / job).glob("node*.log"))
            ]
    return links


def publish(
    run_dir: Path,
    page: Page,
    summary: RunSummary,
    files: Sequence[tuple[str, str]] = (),
    jobs: Sequence[str] = (),
) -> list[str]:
    """Write the scalars, the page (with links to ``files`` (name, what it is) and each
    job's logs) and the summary; the lines to print. Never raises for a bad run folder: a
    report that cannot be written says so in its line."""
    run_dir = Path(run_dir)
    lines = []
    try:
        scalars = write_job_scalars(run_dir, jobs) if tensorboard_available() else []
    except Exception as e:  # a broken event writer must not cost the run its report
        scalars, lines = [], [f"warning: TensorBoard scalars not written ({e})"]
    if not tensorboard_available():
        lines.append(TB_MISSING)
    page.links = [*page.links, *_links(run_dir, files, jobs)]
    if scalars:
        page.links.append(
            Link(
                f"{TB_DIR}/",
                f"TensorBoard scalars of {len(scalars)} jobs: "
                f"tensorboard --logdir {run_dir / TB_DIR}",
            )
        )
    try:
        path = write_page(page, run_dir)
        write_summary(run_dir, summary)
    except OSError as e:
        return [*lines, f"warning: report not written in {run_dir}/ ({e.strerror})"]
    tb = f"; scalars: tensorboard --logdir {run_dir / TB_DIR}" if scalars else ""
    return [*lines, f"report: {path}{tb}"]
