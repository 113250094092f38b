"""The torchrun launcher, pure: its command line from TrainConfig, its bad input, a per-node job
followed by record.rank, and lab up's --launcher plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddp.program.config import TrainConfig
from ddp.program.records import RECORD_PREFIX, ConfigRecord, VerdictRecord
from lab.cli import build_parser
from lab.engine.cluster import NodeHandle
from lab.engine.job import Job
from lab.engine.training import RDZV_PORT, Torchrun
from lab.experiments import up
from lab.node.protocol import ExitRecord, format_line
from tests.lab.test_events import _Api, _Container


def _value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_one_torchrun_per_node_with_c10d_and_ddps_flags():
    cfg = TrainConfig(steps=7, batch_size=8)
    argv = Torchrun(2, 2).argv("train", cfg, "10.0.0.2", "10.0.0.3")
    assert argv[0] == "torchrun"
    assert _value(argv, "--nnodes") == "2" and _value(argv, "--nproc-per-node") == "2"
    assert _value(argv, "--rdzv-backend") == "c10d"
    assert _value(argv, "--rdzv-endpoint") == f"10.0.0.2:{RDZV_PORT}"
    assert _value(argv, "--rdzv-id") == "train" and _value(argv, "--local-addr") == "10.0.0.3"
    assert _value(argv, "--max-restarts") == "0"
    ddp = argv[argv.index("-m") :]
    assert ddp[:3] == ["-m", "ddp", "train"]
    # no rank, world size or shared rendezvous file: the c10d rendezvous assigns them
    assert not {"--rank", "--world-size", "--init-method"} & set(ddp)
    want = cfg.replace(log_dir="/shared/train/logs", emit_records=True)
    assert ddp[3:] == want.to_argv()


def test_elastic_nnodes_and_restarts():
    run = Torchrun(4, 1, max_restarts=2, min_nodes=3)
    assert run.nnodes == "3:4"
    argv = run.argv("j", TrainConfig(batch_size=12), "h")
    assert _value(argv, "--nnodes") == "3:4" and _value(argv, "--max-restarts") == "2"
    assert "--local-addr" not in argv
    assert Torchrun(4, min_nodes=4).nnodes == "4"


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"nodes": 0}, "--nodes"),
        ({"procs_per_node": 0}, "--procs-per-node"),
        ({"max_restarts": -1}, "--max-restarts"),
        ({"nodes": 2, "min_nodes": 3}, "--min-nodes 3 is more than --nodes 2"),
        ({"join_timeout_s": 0}, "--join-timeout"),
    ],
)
def test_bad_torchrun_settings_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        Torchrun(**kwargs)


def _rec(node, record):
    return format_line(node, node, RECORD_PREFIX + record.to_json()).encode() + b"\n"


def test_a_per_node_job_follows_ranks_by_their_records():
    """torchrun put rank 0 on node 1: the verdict is still found, exits are per node."""
    node0 = [_rec(0, ConfigRecord(1, 2, 1, 0)), format_line(0, 0, ExitRecord(0).body()).encode()]
    node1 = [
        _rec(1, ConfigRecord(0, 2, 1, 0)),
        _rec(1, VerdictRecord(0, True, "parity holds")),
        format_line(1, 1, ExitRecord(0, 2.0).body()).encode(),
    ]
    api = _Api({"c0": node0, "c1": node1})
    nodes = [NodeHandle(0, [0, 1], _Container("c0")), NodeHandle(1, [2, 3], _Container("c1"))]
    for node in nodes:  # every node execs through its own engine's client
        node.container.client = SimpleNamespace(api=api)
    cluster = SimpleNamespace(nodes=nodes)
    argvs = {0: ["torchrun", "a"], 1: ["torchrun", "b"]}
    job = Job(cluster, "j", argvs, 30, per_node=True).start()
    assert job.wait(10) == []
    assert job.codes == {0: 0, 1: 0}
    assert sorted(job.records) == [0, 1] and job.verdict.holds
    assert sorted(r.rank for r in job.records[1]) == [1]
    launched = [argv for _, argv in api.created]
    assert all('"torchrun"' in argv[argv.index("--ranks") + 1] for argv in launched)


def _plan(*argv):
    parser, _ = build_parser()
    return up.plan(parser.parse_args(["up", *argv]))


def test_lab_up_launcher_and_procs_per_node():
    plan = _plan("--launcher", "torchrun", "--nodes", "2", "--procs-per-node", "2")
    assert plan.launcher == "torchrun" and plan.layout.world_size == 4
    assert _plan().launcher == "file"
    assert _plan("--ranks-per-node", "2").layout.ranks_per_node == 2


def test_lab_up_refuses_an_unknown_launcher(capsys):
    parser, _ = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--launcher", "mpirun"])
    assert "invalid choice: 'mpirun'" in capsys.readouterr().err
