"""Docker tier: a node that goes away for good under torchrun --nnodes MIN:MAX.

Three nodes x one worker, --nnodes 2:3, --max-restarts 1; when rank 0 logged step 5, node 2's
container is killed (agent and worker together). The two survivors' agents restart their
workers, re-rendezvous as a world of 2 and resume from the newest checkpoint. What changes,
honestly: from then on the data shards follow the new world size, so the run is no longer the
uninterrupted 3-rank run; rank 0's single-process reference is restored from the same
checkpoint and built for the new world, so parity is judged against a reference that follows
the membership, and holds."""

import time

import pytest

from ddp.program.config import TrainConfig
from ddp.program.records import ConfigRecord, StepRecord, load_run
from lab.engine.cluster import Cluster
from lab.engine.events import RecordEvent
from lab.engine.layout import Layout
from lab.engine.specs import job_dir
from lab.engine.training import Torchrun
from lab.experiments.kill.torchrun import restart_timeline

pytestmark = pytest.mark.docker
# 300 ms per step so the fault lands mid-step; a restarted worker resumes by itself
ELASTIC = TrainConfig(
    steps=10,
    batch_size=12,
    checkpoint_every=2,
    auto_resume=True,
    step_delay_ms=300,
    collective_timeout_s=60,
    log_dir=job_dir("elastic"),
)


@pytest.mark.timeout(900)
def test_the_survivors_re_rendezvous_without_the_lost_node_and_finish(client, tmp_path):
    cfg = ELASTIC
    launch = Torchrun(3, 1, max_restarts=1, min_nodes=2)
    events, fault = [], {}
    run_dir = tmp_path / "run"
    with Cluster(client, Layout(3, 1), run_dir=run_dir, lifetime_s=900) as cluster:

        def kill_node2(event):
            events.append(event)
            rec = getattr(event, "record", None)
            hit = isinstance(rec, StepRecord) and rec.rank == 0 and rec.step == 5
            if isinstance(event, RecordEvent) and hit and not fault:
                cluster.nodes[2].container.kill()
                fault.update(t=time.time(), what="node2's container killed (agent and worker)")

        job = cluster.torchrun("elastic", cfg, 500, launch=launch, echo=kill_node2)
        assert job.wait(520) == [], job.running
    assert fault, "rank 0 never reached step 5"
    timeline = restart_timeline(events, fault["t"], fault["what"])
    print("\n".join(["membership change timeline:", *timeline]))
    assert job.codes[2] == 137 and job.codes[0] == 0 and job.codes[1] == 0, job.codes
    after = [e.record for e in events if e.t > fault["t"] and isinstance(e, RecordEvent)]
    worlds = {r.world_size for r in after if isinstance(r, ConfigRecord)}
    assert worlds == {2}, worlds  # the survivors only
    logs = load_run(run_dir / "elastic" / "logs")
    resumed = logs[0].config.start_step
    assert resumed in (4, 6, 8), resumed
    assert logs[0].verdict.holds, logs[0].verdict.message
    assert logs[0].verdict.message.startswith(
        f"parity holds: 2 replicas identical after all {10 - resumed} steps"
    )
    assert logs[0].end.params_sha256 == logs[1].end.params_sha256
