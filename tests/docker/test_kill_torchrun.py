"""Docker tier of ``lab kill --launcher torchrun``, end to end through the command line.

Two nodes x two workers under torchrun with --max-restarts 1: an uninterrupted reference,
then a run in which rank 3's worker process is SIGKILLed when it reports step 4. torchrun's
agents restart the worker group, the workers --auto-resume from the newest checkpoint, and
the command exits 0 only if that is verified: every rank set up again, resumed after a
checkpoint written before the fault, parity holds, and every rank's final parameters equal
the reference's bit for bit. Nothing labelled with the run id is left afterwards.

Run with ``pytest -m docker tests/docker/test_kill_torchrun.py`` after the lab image was built
(``LAB_IMAGE`` picks the tag).
"""

import json

import pytest

from ddp.program.records import load_attempts
from lab.engine.specs import LABEL
from tests.docker.lab_run import lab
from tests.helpers import leftovers

pytestmark = pytest.mark.docker
_LAYOUT = ["--launcher", "torchrun", "--nodes", "2", "--procs-per-node", "2"]
_FAULT = ["--mode", "kill", "--rank", "3", "--at-step", "5"]
FLAGS = [*_LAYOUT, "--max-restarts", "1", *_FAULT, "--steps", "8"]


@pytest.mark.timeout(900)
def test_lab_kill_under_torchrun_recovers_bitwise(client, tmp_path):
    result = lab("kill", "--runs-dir", str(tmp_path), "--no-progress", *FLAGS, timeout=840)
    out = result.stdout
    print(out[out.find("restart timeline") :])
    assert result.returncode == 0, out[-5000:] + result.stderr[-3000:]
    run_id = out.splitlines()[0].split()[1].rstrip(":")
    assert leftovers(client, f"{LABEL}={run_id}") == []

    run_dir = tmp_path / run_id
    report = json.loads((run_dir / "report.json").read_text())
    assert report["ok"] is True and report["bitwise_equal"] is True
    assert all(check["ok"] for check in report["checks"]), report["checks"]
    assert report["kill"]["rank"] == 3 and report["kill"]["code"] == 0
    # Rank 3 logged step 4 before the kill: checkpoint 4 at the latest, 2 if 4 was still
    # being written.
    assert report["resumed_after"] in (2, 4), report["checks"]
    assert report["restarted"] == {str(r): report["resumed_after"] for r in range(4)}
    shas = report["final_params_sha256"]
    assert sorted(shas) == ["0", "1", "2", "3"] and all(s["equal"] for s in shas.values())
    assert len({s["reference"] for s in shas.values()}) == 1  # replicas are identical
    for phase in ("reference", "fault"):
        assert report["phases"][phase]["exit_codes"] == {"0": 0, "1": 0}
    timeline = report["timeline"]
    assert "fault: SIGKILL rank 3's worker" in timeline[0]
    assert any("agent: " in line and "exitcode: -9" in line for line in timeline), timeline
    assert any(f"resuming after step {report['resumed_after']}" in line for line in timeline)

    # Both attempts of every rank were kept: the killed one and the restarted one.
    attempts = load_attempts(run_dir / "fault" / "logs")
    assert sorted(attempts) == [0, 1, 2, 3]
    for rank, logs in attempts.items():
        assert [log.attempt for log in logs] == [0, 1], rank
        assert logs[0].end is None and logs[1].end.params_sha256 == shas[str(rank)]["restarted"]
        assert logs[1].config.start_step == report["resumed_after"]
