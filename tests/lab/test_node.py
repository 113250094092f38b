"""The in-container launcher, run here for real: two gloo ranks on loopback, and the protocol
the host reads from it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.records import ConfigRecord, EndRecord, StepRecord, VerdictRecord
from lab.engine.events import ExitEvent, LineEvent, RecordEvent, parse_event
from lab.engine.specs import launcher_argv
from lab.engine.training import train_argv
from lab.node.protocol import ExitRecord, format_line, parse_exit, parse_line

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _launch(argvs, timeout=120):
    argv = launcher_argv(0, argvs, timeout)
    argv[0] = sys.executable  # the image's `python`; here, this interpreter
    return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)


def _rank_argvs(tmp_path, world, cfg):
    init = f"file://{tmp_path}/rdzv"
    return {
        r: [sys.executable, *train_argv(cfg, Rendezvous(r, world, init))[1:]] for r in range(world)
    }


def test_protocol_round_trip():
    line = format_line(2, 5, ExitRecord(3, 1.25, 300.0).body())
    node, rank, body = parse_line(line)
    assert (node, rank, parse_exit(body)) == (2, 5, ExitRecord(3, 1.25, 300.0))
    assert parse_line("[node1] hello") == (1, None, "hello")
    assert parse_line("no prefix") == (None, None, "no prefix")
    assert parse_exit("@lab-exit {bad") is None and parse_exit("exit 0") is None


@pytest.mark.timeout(150)
def test_two_real_ranks_report_lines_records_and_exits(tmp_path):
    cfg = TrainConfig(steps=2, log_dir=str(tmp_path / "logs"), emit_records=True)
    proc = _launch(_rank_argvs(tmp_path, 2, cfg))
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    events = [parse_event(time.time(), 0, line) for line in out.splitlines()]
    exits = {e.rank: e for e in events if isinstance(e, ExitEvent)}
    assert sorted(exits) == [0, 1]
    for e in exits.values():
        assert e.code == 0 and e.cpu_s > 0 and e.peak_rss_mib > 50  # a torch process
    records = [(e.rank, type(e.record)) for e in events if isinstance(e, RecordEvent)]
    for rank in (0, 1):
        kinds = [k for r, k in records if r == rank]
        assert kinds[0] is ConfigRecord and kinds[-1] is EndRecord
        assert kinds.count(StepRecord) == 2
    assert (0, VerdictRecord) in records and (1, VerdictRecord) not in records
    texts = [e.text for e in events if isinstance(e, LineEvent)]
    assert any("parity holds" in t for t in texts)
    assert not any(t.startswith("@") for t in texts)  # records never show as human lines
    assert sorted(p.name for p in (tmp_path / "logs").glob("rank*.jsonl")) == [
        "rank0.jsonl",
        "rank1.jsonl",
    ]


@pytest.mark.timeout(60)
def test_a_failing_rank_fails_the_node(tmp_path):
    # A world of 2 where only rank 0 exists and rank 1 never comes: the collective timeout
    # (2 s) ends rank 0 with a non-zero exit, which the launcher reports and returns.
    cfg = TrainConfig(steps=2, collective_timeout_s=2.0)
    argvs = {0: _rank_argvs(tmp_path, 2, cfg)[0]}
    proc = _launch(argvs)
    out, _ = proc.communicate(timeout=50)
    assert proc.returncode != 0, out
    codes = [parse_exit(parse_line(line)[2]) for line in out.splitlines()]
    codes = [c.code for c in codes if c]
    assert len(codes) == 1 and codes[0] == proc.returncode


@pytest.mark.timeout(40)
def test_the_launcher_bounds_its_ranks(tmp_path):
    proc = _launch({0: ["sleep", "30"], 1: ["sh", "-c", "echo hi"]}, timeout=1)
    out, _ = proc.communicate(timeout=30)
    exits = {
        r: parse_exit(b).code for _, r, b in map(parse_line, out.splitlines()) if parse_exit(b)
    }
    assert exits == {0: 124, 1: 0}, out
    assert proc.returncode == 124
    assert "[node0/rank1] hi" in out


def test_bad_rank_spec_is_a_usage_error():
    argv = [sys.executable, "-m", "lab.node", "--node", "0", "--ranks", json.dumps({"0": []})]
    r = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "non-empty list" in r.stderr
