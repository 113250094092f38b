"""The pages in a real browser: headless Chromium opens a lab sweep's ``report.html`` and a
failed run's from disk; every image decodes (naturalWidth > 0), the console has no error, the
page fetched nothing but itself, and the headline is there. Screenshots stay in the test's tmp
dir (``report.png``). Needs Debian's chromium (apt-get install -y chromium); 15 s here on a
quiet host, 45 s on a busy one: under a minute, so it runs by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.experiments import latency
from lab.report.failed import report_failure
from tests.browser import SKIP_REASON, check_page, chromium
from tests.lab.test_report_lab import _broken_run, sweep

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium() is None, reason=SKIP_REASON),
]


def _only_itself(requests: list[str], page: Path) -> None:
    """The page asked for nothing but itself (its figures are data: URIs inside it)."""
    fetched = [url for url in requests if not url.startswith("data:image/png;base64,")]
    assert fetched == [page.resolve().as_uri()], fetched


def test_a_sweep_page_shows_its_figures_and_headline(tmp_path):
    result = sweep(tmp_path / "runs" / "20250101-120000-aaaa")
    assert latency.report(result) == 0
    page = result.run_dir / "report.html"
    seen = check_page(page, tmp_path / "browser")
    assert len(seen.images) == 2 and all(i["complete"] and i["width"] > 0 for i in seen.images)
    assert seen.console_errors == []
    _only_itself(seen.requests, page)
    assert seen.figure == "bucketing 5.2x, overlap 1.0x"
    assert seen.verdict == "parity holds in every allreduce configuration"
    assert seen.command == "python -m lab latency" and "Open trace file" in seen.text
    assert seen.screenshot.read_bytes().startswith(b"\x89PNG")


def test_a_failed_run_page_says_why(tmp_path):
    run_dir = tmp_path / "runs" / "20250101-130000-bbbb"
    _broken_run(run_dir)
    report_failure("kill", run_dir, "phase fault timed out after 60 s", 61.0)
    seen = check_page(run_dir / "report.html", tmp_path / "browser")
    assert seen.images == [] and seen.console_errors == []
    _only_itself(seen.requests, run_dir / "report.html")
    assert seen.verdict == "failed: phase fault timed out after 60 s"
    assert seen.figure == "rank 2 missing at step 2"
    assert "fault, rank 1: diagnosis: rank 2 missing at step 2" in seen.text
