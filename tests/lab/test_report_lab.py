"""The lab's results: ``report.html``, ``summary.json`` and ``tb/<job>/`` of a sweep built from
logs written with ddp's own record writer, and the failure page of hand-made broken run
folders (a missing PNG, a torn log line, a rank's failure record, flight dumps)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddp.program.records import ConfigRecord, FailureRecord, RecordLog, StepRecord, load_run
from lab.experiments import latency
from lab.experiments.latency import (
    TRAIN_DEFAULTS,
    ConfigRun,
    LatencyPlan,
    LinkReport,
    SweepResult,
    analyse,
    summarize,
    write_files,
)
from lab.experiments.latency import page as latency_page
from lab.report.failed import failure_report, key_figure, report_failure
from lab.report.publish import publish
from lab.report.summary import read_summary
from tests.lab.latency_logs import write_logs

_TB_REASON = "tensorboard is not installed (pip install -c constraints.txt -e '.[lab]')"


def sweep(run_dir: Path) -> SweepResult:
    """A finished ``lab latency`` at 5 ms, caps 0 and 1: per-parameter 24 x 30 ms of
    allreduce, cap 1 4 x 30 ms, everything + 20 ms of compute."""
    plan = LatencyPlan(caps=(0, 1), rounds=1, train=TRAIN_DEFAULTS.replace(steps=6))
    result = SweepResult(plan, run_dir.name, run_dir, seconds=75.0)
    result.links.append(LinkReport(5.0, "netem", line="rtt p50 10.2 ms", rtt_p50_ms=10.2))
    for p in plan.jobs(5.0):
        conf = p.conf
        ms = 20.0 + (0.0 if conf.is_floor else 30.0 * (24 if conf.cap_mb == 0 else 4))
        d = write_logs(
            run_dir / p.job / "logs",
            buckets=24 if conf.cap_mb == 0 else 4,
            sync="none" if conf.is_floor else "allreduce",
            parity=not conf.is_floor,
            step_ms=lambda r, s, ms=ms: ms + r,
        )
        stats = summarize([(p.job, load_run(d))], plan.warmup)
        ok = None if conf.is_floor else True
        result.runs.append(ConfigRun(conf, 5.0, 1, p.job, {r: 0 for r in range(4)}, stats, ok, 1.0))
    return result


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> tuple[SweepResult, int]:
    result = sweep(tmp_path_factory.mktemp("runs") / "20250101-120000-aaaa")
    return result, latency.report(result)


def test_the_sweep_writes_its_page_from_the_result_objects(reported):
    result, code = reported
    assert code == 0
    page = (result.run_dir / "report.html").read_text()
    # 743 / 143: the headline's ratio from the rows (slowest rank +3 ms), not from text
    assert "bucketing 5.2x, overlap 1.0x" in page
    assert "parity holds in every allreduce configuration" in page
    assert page.count("data:image/png;base64,") == 2  # latency.png and gantt.png
    for href in ("latency.csv", "latency.json", "trace.json", "tb/"):
        assert f'href="{href}"' in page and (result.run_dir / href).exists()
    assert "5ms-cap0-overlap-r1/logs/" in page and "rtt p50 10.2 ms" in page
    assert "ui.perfetto.dev" in page


def test_the_summary_has_what_the_runs_list_needs(reported):
    result, _ = reported
    s = read_summary(result.run_dir)
    assert (s.experiment, s.run_id, s.ok, s.seconds) == ("latency", result.run_id, True, 75.0)
    assert s.figure == "bucketing 5.2x, overlap 1.0x"
    assert s.configs["5 ms, per-parameter, overlap on"] == 743.0
    assert set(s.configs) == {f"5 ms, {r.conf.label}" for r in result.runs}


def test_every_job_has_its_scalars_read_back_by_tensorboard(reported):
    pytest.importorskip("tensorboard", reason=_TB_REASON)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result, _ = reported
    jobs = sorted(p.name for p in (result.run_dir / "tb").iterdir())
    assert jobs == sorted(r.job for r in result.runs)
    acc = EventAccumulator(str(result.run_dir / "tb" / "5ms-cap0-overlap-r1"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "step_ms", "comm_wait_ms", "exposed_comm_ms"}
    assert [e.step for e in acc.Scalars("step_ms")] == [1, 2, 3, 4, 5, 6]
    assert acc.Scalars("step_ms")[0].value == pytest.approx(743.0)  # the slowest rank's
    # synthetic timeline: backward ends at 10 ms, the last of 24 buckets is done at 500 ms
    assert acc.Scalars("exposed_comm_ms")[0].value == pytest.approx(490.0)


def _broken_run(run_dir: Path) -> None:
    """A kill-like run folder: rank 1 wrote a failure record, rank 2's last line is torn, the
    figure it promised was never drawn."""
    logs = run_dir / "fault" / "logs"
    for rank in range(3):
        log = RecordLog(str(logs), rank)
        log.write(ConfigRecord(rank, 3, 1, 0))
        log.write(StepRecord(rank, 1, 2.0, 1.0, 10.0, 4.0))
        if rank == 1:
            why = "diagnosis: rank 2 missing at step 2 (allreduce of bucket 0, seq 4); rank 1 "
            log.write(FailureRecord(1, why + "noticed after 0.1 s", [2]))
        log.close()
    with open(logs / "rank2.jsonl", "a") as f:
        f.write('{"event": "step", "rank": 2, "st')


def test_a_failed_run_gets_a_page_that_says_why_with_the_diagnosis(tmp_path, capsys):
    run_dir = tmp_path / "20250101-130000-bbbb"
    _broken_run(run_dir)
    report_failure("kill", run_dir, "phase fault timed out after 60 s", 61.0)
    assert "report: " in capsys.readouterr().err
    page = (run_dir / "report.html").read_text()
    assert "failed: phase fault timed out after 60 s" in page
    assert 'id="figure" class="figure">rank 2 missing at step 2<' in page
    assert "fault, rank 1: diagnosis: rank 2 missing at step 2" in page
    assert "last line torn in rank [2]" in page
    s = read_summary(run_dir)
    assert s.ok is False and s.experiment == "kill" and s.figure == "rank 2 missing at step 2"


def test_the_failure_page_of_a_sweep_whose_logs_give_no_figures(tmp_path, capsys):
    result = sweep(tmp_path / "20250101-140000-cccc")
    shutil.rmtree(result.run_dir / "5ms-cap1-overlap-r1" / "logs")  # never collected
    assert latency.report(result) == 1
    page = (result.run_dir / "report.html").read_text()
    assert "failed: the logs cannot give the figures: " in page
    assert "5ms-cap1-overlap-r1/logs: no rank logs" in page
    assert read_summary(result.run_dir).ok is False
    assert "report: " in capsys.readouterr().err


def test_a_missing_png_is_said_so_not_a_broken_image(reported, tmp_path):
    result, _ = reported
    summary = analyse(result)
    write_files(summary)
    (result.run_dir / "gantt.png").unlink()
    r = latency_page(summary)
    publish(result.run_dir, r.page, r.summary, r.files, r.jobs)
    page = (result.run_dir / "report.html").read_text()
    assert "figure gantt.png: not written" in page and page.count("<img") == 1


def test_key_figure_is_the_head_of_a_diagnosis():
    line = "diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3"
    assert key_figure(line) == "rank 2 missing at step 5"


def test_failure_report_of_an_empty_folder(tmp_path):
    page, summary, jobs = failure_report("up", "x", tmp_path, "the engine failed")
    assert jobs == [] and summary.verdict == "failed: the engine failed" and summary.figure == ""
    assert json.dumps(summary.configs) == "{}"
    assert page.headline.ok is False


def test_without_tensorboard_the_run_goes_on_and_one_line_says_so(tmp_path, capsys, monkeypatch):
    import lab.report.publish as publish_module

    monkeypatch.setattr(publish_module, "tensorboard_available", lambda: False)
    result = sweep(tmp_path / "20250101-150000-dddd")
    assert latency.report(result) == 0
    out = capsys.readouterr().out
    assert out.count("tensorboard is not installed (pip install tensorboard") == 1
    assert not (result.run_dir / "tb").exists() and (result.run_dir / "report.html").exists()
