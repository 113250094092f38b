"""The in-container node launcher, run here for real: two gloo ranks on loopback."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.watch import _EXIT, parse_line

ROOT = Path(__file__).resolve().parents[1]


def _launcher(tmp_path, *extra, ranks="0,1", world=2, go_timeout=60):
    cmd = [sys.executable, "-m", "lab.node", "--node", "0", "--ranks", ranks,
           "--world-size", str(world), "--init-method", f"file://{tmp_path}/rdzv",
           "--log-dir", str(tmp_path / "logs"), "--go-file", str(tmp_path / "go"),
           "--go-timeout", str(go_timeout), "--", "--steps", "2", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


@pytest.mark.timeout(120)
def test_ranks_wait_for_go_then_report_prefixed_output_and_exits(tmp_path):
    proc = _launcher(tmp_path)
    try:
        time.sleep(1.0)
        assert proc.poll() is None, "the launcher must wait for the go file"
        assert not (tmp_path / "logs").exists(), "no rank may start before go"
        (tmp_path / "go").touch()
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    parsed = [parse_line(line) for line in out.splitlines()]
    assert all(node == 0 and rank in (0, 1) for node, rank, _ in parsed), out
    exits = {rank: _EXIT.match(text) for _, rank, text in parsed if _EXIT.match(text)}
    assert sorted(exits) == [0, 1]
    for m in exits.values():
        code, cpu_s, peak_mib = int(m.group(1)), float(m.group(2)), float(m.group(3))
        assert code == 0 and cpu_s > 0 and peak_mib > 50  # a torch process: tens of MiB at least
    assert any("parity holds" in text for _, rank, text in parsed if rank == 0), out
    logs = sorted(p.name for p in (tmp_path / "logs").glob("rank*.jsonl"))
    assert logs == ["rank0.jsonl", "rank1.jsonl"]


@pytest.mark.timeout(60)
def test_a_failing_rank_fails_the_node(tmp_path):
    # A world of 2 where only rank 0 exists on this node and rank 1 never comes: the
    # collective timeout (2 s) ends rank 0 with a non-zero exit, which the launcher reports.
    (tmp_path / "go").touch()
    proc = _launcher(tmp_path, "--timeout", "2", ranks="0")
    try:
        out, _ = proc.communicate(timeout=50)
    finally:
        proc.kill()
    assert proc.returncode != 0, out
    exits = [_EXIT.match(parse_line(line)[2]) for line in out.splitlines()]
    codes = [int(m.group(1)) for m in exits if m]
    assert len(codes) == 1 and codes[0] != 0, out


@pytest.mark.timeout(30)
def test_no_go_file_ends_the_node(tmp_path):
    proc = _launcher(tmp_path, go_timeout=0.3)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 3
    assert "no go file" in out
