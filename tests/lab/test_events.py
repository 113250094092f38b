"""The one follower: a job's streams become typed events and the job's state, including a node
whose container died mid-run. The Docker side is a stand-in here (streams of bytes); the real
engine is the container tier's (tests/docker)."""

import time
from types import SimpleNamespace

from ddp.program.records import RECORD_PREFIX, StepRecord, VerdictRecord
from lab.engine.cluster import NodeHandle
from lab.engine.events import ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.node.protocol import ExitRecord, format_line


class _Api:
    def __init__(self, streams):
        self.streams, self.created = streams, []

    def exec_create(self, container_id, argv, environment=None):
        self.created.append((container_id, argv))
        return {"Id": container_id}

    def exec_start(self, exec_id, stream):
        return iter(self.streams[exec_id])

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}


class _Container:
    def __init__(self, name, running=True, code=0):
        self.id, self.attrs = name, {"State": {"Running": running, "ExitCode": code}}

    def reload(self):
        pass


def _job(streams, containers, ranks_per_node=1, argvs=None):
    api = _Api(streams)
    nodes = [
        NodeHandle(i, list(range(i * ranks_per_node, (i + 1) * ranks_per_node)), c)
        for i, c in enumerate(containers)
    ]
    for c in containers:  # every node execs through its own engine's client
        c.client = SimpleNamespace(api=api)
    cluster = SimpleNamespace(nodes=nodes)
    world = len(containers) * ranks_per_node
    argvs = argvs or {r: ["true"] for r in range(world)}
    seen = []
    return Job(cluster, "j", argvs, 30, echo=seen.append).start(), seen, api


def _rec(node, rank, record):
    return format_line(node, rank, RECORD_PREFIX + record.to_json()).encode() + b"\n"


def test_streams_become_typed_events_in_order():
    step = StepRecord(0, 1, 2.0, 1.0, 5.0, 1.0)
    node0 = [
        b"[node0/rank0] hello\n[node0/rank0] par",  # a line split across chunks
        b"tial\n" + _rec(0, 0, step) + _rec(0, 0, VerdictRecord(0, True, "parity holds")),
        format_line(0, 0, ExitRecord(0, 1.5, 300.0).body()).encode() + b"\n",
    ]
    node1 = [b"[node1] launcher says hi\n", format_line(1, 1, ExitRecord(1).body()).encode()]
    job, seen, api = _job({"c0": node0, "c1": node1}, [_Container("c0"), _Container("c1")])
    assert job.wait(10) == []
    assert job.codes == {0: 0, 1: 1} and job.done
    assert job.exits[0].cpu_s == 1.5 and job.exits[1].cpu_s is None
    assert job.records[0] == [step, VerdictRecord(0, True, "parity holds")]
    assert job.verdict.holds
    texts = [(e.rank, e.text) for e in seen if isinstance(e, LineEvent)]
    assert texts == [(0, "hello"), (0, "partial"), (None, "launcher says hi")] or sorted(
        texts, key=str
    ) == sorted([(0, "hello"), (0, "partial"), (None, "launcher says hi")], key=str)
    assert [type(e) for e in seen if e.node == 0] == [
        LineEvent,
        LineEvent,
        RecordEvent,
        RecordEvent,
        ExitEvent,
    ]
    assert [argv[:3] for _, argv in api.created] == [["python", "-m", "lab.node"]] * 2
    assert "hello" in job.output(0) and job.last_lines(0).endswith("partial")


def test_a_killed_container_ends_its_ranks_with_its_exit_code():
    """No exit record: the container died (SIGKILL), so its ranks get the container's 137."""
    job, _, _ = _job(
        {"c0": [b"[node0/rank0] step\n", b"[node0/rank1] step\n"]},
        [_Container("c0", running=False, code=137)],
        ranks_per_node=2,
    )
    assert job.wait(10) == []
    assert job.codes == {0: 137, 1: 137}


def test_wait_gives_up_after_the_deadline_and_after_a_failure_grace():
    def silent():
        time.sleep(5)  # in the reader thread: a stream that says nothing for a while
        yield b""

    job, _, _ = _job({"c0": silent()}, [_Container("c0")])
    assert job.wait(0.5) == [0]
    fail = format_line(0, 0, ExitRecord(3).body()).encode() + b"\n"
    job, _, _ = _job({"c0": [fail], "c1": silent()}, [_Container("c0"), _Container("c1")])
    assert job.wait(10, fail_grace_s=0.3) == [1]
    assert job.codes == {0: 3}


def test_nodes_without_ranks_in_the_job_get_no_exec():
    job, _, api = _job({"c0": []}, [_Container("c0"), _Container("c1")], argvs={0: ["true"]})
    assert [cid for cid, _ in api.created] == ["c0"]
    job.wait(5)
    assert job.codes == {0: 0}  # the stream ended without an exit record: container state
