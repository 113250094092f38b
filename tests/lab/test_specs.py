"""What lab would create for a run, and the command line each rank gets: pure, no engine."""

import argparse
import json
import re

import pytest

from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.flags import add_train_arguments, config_from_args
from lab.engine.layout import Layout
from lab.engine.specs import (
    LABEL,
    MOUNT,
    container_spec,
    job_dir,
    launcher_argv,
    network_spec,
    new_run_id,
    volume_spec,
)
from lab.engine.training import rank_configs, train_argvs

RUN = "20260101-120000-abcd"


def test_every_resource_carries_the_run_label():
    specs = [network_spec(RUN), volume_spec(RUN)] + [container_spec(RUN, i) for i in range(3)]
    assert all(s["labels"][LABEL] == RUN for s in specs)
    assert len({s["name"] for s in specs[2:]}) == 3  # containers are distinct


def test_container_joins_the_runs_network_and_volume_and_idles_bounded():
    spec = container_spec(RUN, 3, image="img:1", lifetime_s=99.6)
    assert spec["image"] == "img:1" and spec["hostname"] == "node3"
    assert spec["network"] == network_spec(RUN)["name"]
    assert spec["volumes"] == {volume_spec(RUN)["name"]: {"bind": MOUNT, "mode": "rw"}}
    assert spec["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert spec["environment"]["OMP_NUM_THREADS"] == "1"
    assert spec["command"] == ["sleep", "100"]
    assert "cap_add" not in spec and "nano_cpus" not in spec
    assert container_spec(RUN, 0, net_admin=True)["cap_add"] == ["NET_ADMIN"]
    assert container_spec(RUN, 0, cpus=0.5)["nano_cpus"] == 500_000_000


def test_job_dirs_live_on_the_volume():
    assert job_dir("train") == f"{MOUNT}/train"
    for bad in ("../x", "a/b", "", "-x"):
        with pytest.raises(ValueError, match="job name"):
            job_dir(bad)


def test_run_ids():
    ids = {new_run_id() for _ in range(20)}
    assert len(ids) == 20
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", i) for i in ids)
    with pytest.raises(ValueError, match="run id"):
        network_spec("Bad/Id")


def test_launcher_gets_each_ranks_argv():
    argv = launcher_argv(1, {3: ["b"], 2: ["a", "x y"]}, 60)
    assert argv[:3] == ["python", "-m", "lab.node"]
    assert json.loads(argv[argv.index("--ranks") + 1]) == {"2": ["a", "x y"], "3": ["b"]}
    assert argv[argv.index("--timeout") + 1] == "60"


def _parse_train(argv):
    """What `python -m ddp train` would make of an argv lab built."""
    assert argv[:4] == ["python", "-m", "ddp", "train"]
    p = argparse.ArgumentParser()
    for flag, kind in (("--rank", int), ("--world-size", int), ("--init-method", str)):
        p.add_argument(flag, type=kind)
    names = add_train_arguments(p)
    args = p.parse_args(argv[4:])
    return Rendezvous(args.rank, args.world_size, args.init_method), config_from_args(args, names)


def test_rank_argvs_rebuild_each_ranks_config_exactly():
    layout = Layout(2, 2)
    cfg = TrainConfig(steps=3, bucket_cap_mb=0.1, overlap=False)
    argvs = train_argvs("fault", layout, cfg, overrides={2: {"step_delay_ms": 250.0}})
    assert sorted(argvs) == [0, 1, 2, 3]
    configs = rank_configs("fault", layout, cfg, overrides={2: {"step_delay_ms": 250.0}})
    for rank, argv in argvs.items():
        rdzv, got = _parse_train(argv)
        assert rdzv == Rendezvous(rank, 4, f"file://{MOUNT}/fault/rendezvous")
        assert got == configs[rank]
        assert got.log_dir == f"{MOUNT}/fault/logs" and got.emit_records
        assert got.step_delay_ms == (250.0 if rank == 2 else 0.0)
        assert got.replace(log_dir=None, emit_records=False, step_delay_ms=0.0) == cfg


def test_rank_configs_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="not divisible by the world size 3"):
        rank_configs("j", Layout(3, 1), TrainConfig())
    with pytest.raises(ValueError, match=r"overrides for ranks \[4\]"):
        rank_configs("j", Layout(4, 1), TrainConfig(), overrides={4: {"steps": 2}})
    with pytest.raises(ValueError, match="unknown training setting"):
        rank_configs("j", Layout(4, 1), TrainConfig(), overrides={1: {"stpes": 2}})
