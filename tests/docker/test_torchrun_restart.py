"""Docker tier: torchrun's elastic agent restarts a killed worker and the run resumes.

Two nodes x two workers under torchrun with --max-restarts 1; when rank 0 has logged step 5,
one worker process on node 1 is SIGKILLed (not its container: the agent survives to see it).
The agent restarts the worker group, the new workers --auto-resume from the newest checkpoint
on the shared volume, and every rank's final parameters equal an uninterrupted run's bit for
bit. The timeline (fault, the agent's report, the resumed step, the verdict) is printed."""

import time

import pytest

from ddp.program.config import TrainConfig
from ddp.program.records import StepRecord, load_run
from lab.engine.cluster import Cluster
from lab.engine.events import RecordEvent
from lab.engine.layout import Layout
from lab.engine.specs import LABEL, job_dir
from lab.engine.training import Torchrun
from lab.experiments.kill.torchrun import (
    PS_ARGV,
    compare_final,
    restart_timeline,
    worker_pids,
)
from tests.helpers import leftovers

pytestmark = pytest.mark.docker
KILL_AT = 5  # rank 0's step after which a worker dies (checkpoints every 2)


@pytest.mark.timeout(900)
def test_a_killed_worker_is_restarted_by_torchrun_and_ends_bitwise_equal(client, tmp_path):
    cfg = TrainConfig(
        steps=10,
        checkpoint_every=2,
        auto_resume=True,
        step_delay_ms=300,
        collective_timeout_s=60,
        log_dir=job_dir("plain"),  # lab sets each job's own
    )
    launch = Torchrun(2, 2, max_restarts=1)
    events, fault = [], {}
    run_dir = tmp_path / "run"
    with Cluster(client, Layout(2, 2), run_dir=run_dir, lifetime_s=900) as cluster:
        label = f"{LABEL}={cluster.run_id}"
        plain = cluster.torchrun("plain", cfg, 300, launch=launch)
        assert plain.wait(320) == [] and plain.codes == {0: 0, 1: 0}, plain.codes

        def kill_a_worker(event):
            events.append(event)
            rec = getattr(event, "record", None)
            hit = isinstance(rec, StepRecord) and rec.rank == 0 and rec.step == KILL_AT
            if isinstance(event, RecordEvent) and hit and not fault:
                pids = worker_pids(cluster.exec(1, PS_ARGV)[1])
                assert len(pids) == 2, pids
                cluster.check(1, ["kill", "-9", str(pids[-1])], "kill a worker")
                fault.update(t=time.time(), what=f"SIGKILL worker pid {pids[-1]} on node1")

        job = cluster.torchrun("restarted", cfg, 400, launch=launch, echo=kill_a_worker)
        assert job.wait(420) == [], job.running
    assert leftovers(client, label) == []
    assert fault, "rank 0 never reached the step of the fault"
    timeline = restart_timeline(events, fault["t"], fault["what"])
    print("\n".join(["restart timeline:", *timeline]))
    assert job.codes == {0: 0, 1: 0}, "\n".join(timeline)  # both agents: success in the end
    assert any("agent: " in line and "exitcode: -9" in line for line in timeline), timeline
    recovered = compare_final(
        load_run(run_dir / "plain" / "logs"), load_run(run_dir / "restarted" / "logs")
    )
    print(recovered.line)
    # The kill lands a step or two after KILL_AT on a loaded host: the newest checkpoint then.
    after = recovered.resumed_after
    assert after in (4, 6, 8), recovered.line
    assert any(f"resuming after step {after}" in line for line in timeline), timeline
    verdict = f"verdict: parity holds: 4 replicas identical after all {10 - after} steps"
    assert any(verdict in line for line in timeline), timeline
    assert recovered.ok, recovered.line
