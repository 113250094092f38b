"""``python -m ddp --log-dir DIR`` writes DIR/report.html and DIR/tb/: checked on a real local
run (two spawned CPU ranks on gloo), its page read as HTML and its scalars read back with
TensorBoard's own reader."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pytest

from tests.helpers import run_ddp

_TB_REASON = "tensorboard is not installed (pip install -c constraints.txt -e '.[lab]')"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[Path, str]:
    log_dir = tmp_path_factory.mktemp("ddp-run") / "logs"
    proc = run_ddp("--world-size", "2", "--steps", "3", "--log-dir", str(log_dir), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"report: {log_dir / 'report.html'}" in proc.stderr  # stdout: the table, verdict last
    assert proc.stdout.splitlines()[-1].startswith("parity holds")
    return log_dir, proc.stdout


def test_the_page_has_the_headline_the_steps_and_the_files(run_dir):
    log_dir, out = run_dir
    page = (log_dir / "report.html").read_text()
    verdict = next(line for line in out.splitlines() if line.startswith("parity holds"))
    assert html.escape(verdict, quote=False) in page  # rank 0's verdict record, as printed
    assert "python -m ddp --world-size 2 --steps 3 --log-dir" in page
    assert re.search(r'id="figure"[^>]*>max \|param diff\| vs single process \d', page)
    steps = re.findall(r'<tr><td class="num">(\d+)</td>', page)
    assert steps[:3] == ["1", "2", "3"]  # the per-step table, from the step records
    for href in ("rank0.jsonl", "rank1.jsonl", "flight/flight_rank0.json", "tb/"):
        assert f'href="{href}"' in page and (log_dir / href).exists()
    assert "http://" not in page and "https://" not in page  # opens offline


def test_the_scalars_read_back_with_tensorboards_reader(run_dir):
    pytest.importorskip("tensorboard", reason=_TB_REASON)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir, _ = run_dir
    acc = EventAccumulator(str(log_dir / "tb" / "ddp"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"loss", "step_ms", "comm_wait_ms", "exposed_comm_ms", "max_param_diff"}
    for tag in tags:
        assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3], tag
    assert all(e.value < 1e-5 for e in acc.Scalars("max_param_diff"))  # parity held
    assert all(e.value > 0 for e in acc.Scalars("step_ms"))


def test_no_figure_is_embedded_that_is_not_a_png(run_dir):
    page = (run_dir[0] / "report.html").read_text()
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
