"""The generic page (``ddp.report``): autoescaped, figures embedded or said missing, links
checked, and a run folder with broken logs still gets a page that says what is wrong."""

from __future__ import annotations

import base64

from ddp.program.records import ConfigRecord, EndRecord, FailureRecord, RecordLog, StepRecord
from ddp.report import Figure, Headline, Link, Page, Section, Table, Text, render_page, write_page
from ddp.report.local import local_page

# The smallest valid PNG (1x1, grey).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
)


def _page(tmp_path, **kw) -> str:
    page = Page("t", Headline("python -m x", "it <worked>", "1.7x & more", True), **kw)
    return render_page(page, tmp_path)


def test_everything_from_a_record_is_escaped(tmp_path):
    text = _page(
        tmp_path, sections=[Section("s", [Table(["<b>"], [["<script>alert(1)"]]), Text(["a & b"])])]
    )
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)" in text
    assert "it &lt;worked&gt;" in text and "1.7x &amp; more" in text and "a &amp; b" in text


def test_a_png_is_embedded_and_a_missing_or_torn_one_is_said_so(tmp_path):
    (tmp_path / "ok.png").write_bytes(PNG)
    (tmp_path / "torn.png").write_bytes(b"\x89PN")
    figs = [Figure(tmp_path / n, n) for n in ("ok.png", "gone.png", "torn.png")]
    text = _page(tmp_path, sections=[Section("f", figs)])
    assert text.count("data:image/png;base64,") == 1
    assert "figure gone.png: not written" in text and "figure torn.png: not a PNG" in text
    assert text.count("<img") == 1  # never a broken image


def test_links_are_relative_and_a_missing_file_is_marked(tmp_path):
    (tmp_path / "trace.json").write_text("{}")
    text = _page(tmp_path, links=[Link("trace.json", "t"), Link("gone.csv", "g")])
    assert '<a href="trace.json">' in text and "gone.csv (missing)" in text
    assert "ui.perfetto.dev" in text and "Open trace file" in text


def _logs(log_dir, torn: bool = False, corrupt: bool = False) -> None:
    for rank in (0, 1):
        log = RecordLog(str(log_dir), rank)
        log.write(ConfigRecord(rank, 2, 1, 0))
        log.write(StepRecord(rank, 1, 2.0, 1.0, 10.0 + rank, 4.0, max_param_diff=1e-8))
        if rank == 1:
            log.write(FailureRecord(1, "diagnosis: rank 0 missing at step 2 (allreduce)", [0]))
        else:
            log.write(EndRecord(0, True, "ab"))
        log.close()
    path = log_dir / "rank0.jsonl"
    if torn:
        path.write_text(path.read_text() + '{"event": "step", "ra')
    if corrupt:
        lines = path.read_text().splitlines()
        path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")


def test_a_torn_last_line_is_shown_not_a_crash(tmp_path):
    _logs(tmp_path, torn=True)
    page = local_page(tmp_path, "python -m ddp", 3, "diagnosis: rank 0 missing at step 2")
    assert any("rank 0: last line torn" in p for p in page.problems)
    assert page.headline.verdict.startswith("diagnosis: rank 0 missing") and not page.headline.ok
    text = render_page(page, tmp_path)
    assert "Diagnosis" in text and "failed: diagnosis: rank 0 missing at step 2" in text


def test_a_corrupt_log_is_said_so_on_the_page(tmp_path):
    _logs(tmp_path, corrupt=True)
    page = local_page(tmp_path, "python -m ddp", 1, "")
    assert page.problems and "cannot be read" in page.problems[0]
    assert page.headline.verdict == "exit 1: parity broken"
    path = write_page(page, tmp_path)
    assert path.name == "report.html" and "cannot be read" in path.read_text()


def test_the_page_never_fetches_anything(tmp_path):
    _logs(tmp_path)
    text = render_page(local_page(tmp_path, "python -m ddp", 0, ""), tmp_path)
    assert "http" not in text.replace("ui.perfetto.dev", "")
    assert "<script" not in text and "<link" not in text  # no script, no stylesheet to fetch
