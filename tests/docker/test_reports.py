"""Docker tier: the results of real runs in containers, read as people read them. ``lab latency
--quick`` and ``lab kill`` each leave ``report.html`` (opened in headless Chromium: every image
decodes, no console error, nothing fetched but the page, the headline there), ``summary.json``
(what ``lab runs`` lists) and the scalars of every job under ``tb/<job>/``.

Run with ``pytest -m docker tests/docker/test_reports.py`` after the lab image was built
(``LAB_IMAGE`` picks the tag); the browser checks skip without chromium.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser import SKIP_REASON, check_page, chromium
from tests.docker.lab_run import lab, run_lab

pytestmark = pytest.mark.docker


def _browser_check(run_dir: Path, out_dir: Path, images: int):
    if chromium() is None:
        pytest.skip(SKIP_REASON)
    page = run_dir / "report.html"
    seen = check_page(page, out_dir)
    assert len(seen.images) == images
    assert all(i["complete"] and i["width"] > 0 for i in seen.images), seen.images
    assert seen.console_errors == []
    assert [u for u in seen.requests if not u.startswith("data:")] == [page.resolve().as_uri()]
    assert seen.command.startswith("python -m lab ")
    return seen


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.timeout(1000)
def test_latency_quick_leaves_a_page_a_summary_and_scalars(client, tmp_path):
    _, run_id = run_lab(
        client, ["latency", "--quick", "--no-progress", "--runs-dir", str(tmp_path)], 960
    )
    run_dir = tmp_path / run_id
    seen = _browser_check(run_dir, tmp_path / "browser", images=2)  # latency.png, gantt.png
    assert seen.figure.startswith("bucketing ") and ", overlap " in seen.figure
    assert seen.verdict == "parity holds in every allreduce configuration"
    summary = _summary(run_dir)
    assert summary["experiment"] == "latency" and summary["ok"] is True
    # --quick: two phases, 6 latency-bound and 4 bandwidth-bound configurations, one round
    assert summary["figure"] == seen.figure and len(summary["configs"]) == 10
    jobs = sorted(p.name for p in (run_dir / "tb").iterdir())
    assert len(jobs) == 10 and all(list((run_dir / "tb" / j).glob("events.out.*")) for j in jobs)
    listed = lab("runs", "--runs-dir", str(tmp_path), timeout=60)
    assert listed.returncode == 0 and run_id in listed.stdout and seen.figure in listed.stdout


@pytest.mark.timeout(900)
def test_kill_leaves_a_page_with_the_diagnosis(client, tmp_path):
    argv = [
        "kill",
        "--rank",
        "1",
        "--at-step",
        "3",
        "--mode",
        "kill",
        "--nodes",
        "2",
        "--steps",
        "5",
        "--no-progress",
    ]
    proc = lab(*argv, "--runs-dir", str(tmp_path), timeout=860)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = proc.stdout.split()[1].rstrip(":")
    run_dir = tmp_path / run_id
    seen = _browser_check(run_dir, tmp_path / "browser", images=0)
    assert seen.figure.startswith("rank 1 missing at step 3"), seen.figure
    assert seen.verdict.startswith("diagnosis: rank 1 missing at step 3")
    assert "Timeline of the fault phase" in seen.text and "FAULT: rank 1" in seen.text
    assert _summary(run_dir)["experiment"] == "kill" and _summary(run_dir)["ok"] is True
