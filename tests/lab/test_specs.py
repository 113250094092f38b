"""What lab would create for a run: names, labels, mounts and the node commands."""

import re

import pytest

from lab.specs import (
    GO_FILE,
    LABEL,
    LOG_DIR,
    MOUNT,
    RENDEZVOUS,
    container_spec,
    network_spec,
    new_run_id,
    node_command,
    volume_spec,
)
from lab.topology import Topology, TrainSettings

RUN = "20260101-120000-abcd"


def test_every_resource_carries_the_run_label():
    topo = Topology(nodes=2, ranks_per_node=2)
    specs = [network_spec(RUN), volume_spec(RUN)]
    specs += [container_spec(RUN, topo, i) for i in range(topo.nodes)]
    assert all(s["labels"][LABEL] == RUN for s in specs)
    assert len({s["name"] for s in specs[2:]}) == topo.nodes  # containers are distinct


def test_container_joins_the_runs_network_and_volume():
    spec = container_spec(RUN, Topology(), 3, image="img:1")
    assert spec["image"] == "img:1"
    assert spec["hostname"] == "node3"
    assert spec["network"] == network_spec(RUN)["name"]
    assert spec["volumes"] == {volume_spec(RUN)["name"]: {"bind": MOUNT, "mode": "rw"}}
    assert spec["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert spec["environment"]["OMP_NUM_THREADS"] == "1"
    assert "cap_add" not in spec
    assert container_spec(RUN, Topology(), 0, net_admin=True)["cap_add"] == ["NET_ADMIN"]


def test_node_commands_partition_the_ranks():
    topo = Topology(nodes=2, ranks_per_node=2, train=TrainSettings(steps=3, overlap=False))
    seen = []
    for node in range(topo.nodes):
        cmd = node_command(topo, node)
        assert cmd[:3] == ["python", "-m", "lab.node"]
        seen += [int(r) for r in cmd[cmd.index("--ranks") + 1].split(",")]
        assert cmd[cmd.index("--world-size") + 1] == "4"
        assert cmd[cmd.index("--init-method") + 1] == f"file://{RENDEZVOUS}"
        assert cmd[cmd.index("--log-dir") + 1] == LOG_DIR
        assert cmd[cmd.index("--go-file") + 1] == GO_FILE
        train = cmd[cmd.index("--") + 1 :]
        assert train == topo.train.ddp_flags() and "--no-overlap" in train
    assert seen == [0, 1, 2, 3]


def test_shared_paths_live_on_the_volume():
    for path in (RENDEZVOUS, LOG_DIR, GO_FILE):
        assert path.startswith(MOUNT + "/")


def test_run_ids():
    ids = {new_run_id() for _ in range(20)}
    assert len(ids) == 20
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", i) for i in ids)
    with pytest.raises(ValueError, match="run id"):
        network_spec("Bad/Id")
