"""The faults without Docker: the commands they run and the calls they make, on a fake cluster
that records them; release is idempotent and undoes exactly what was done."""

import time
from types import SimpleNamespace

import docker.errors
import pytest

from lab.engine.client import LabError
from lab.faults import FAULTS
from lab.faults.partition import CHAIN, partition_commands, shell_script


class _Container:
    id = "c0ffee"

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.killed_at: float | None = None
        self.client = SimpleNamespace(events=self._events)

    def kill(self) -> None:
        self.calls.append("kill")
        if self.fail:
            raise docker.errors.NotFound("gone")
        self.killed_at = time.time()

    def _events(self, since: float, until: float, decode: bool, filters: dict) -> list[dict]:
        """The engine's event log: an older kill of this container, then this one."""
        assert filters == {"container": self.id, "event": "kill"} and since < until
        if self.killed_at is None:
            return []
        return [{"timeNano": int((since - 5) * 1e9)}, {"timeNano": int(self.killed_at * 1e9)}]

    def pause(self) -> None:
        self.calls.append("pause")


class _Cluster:
    """Just what a fault uses: nodes with containers, address, exec, check."""

    def __init__(self, n: int = 3, exit_code: int = 0, fail_kill: bool = False) -> None:
        self.nodes = [SimpleNamespace(index=i, container=_Container(fail_kill)) for i in range(n)]
        self.execs: list[tuple[int, list[str]]] = []
        self.exit_code = exit_code

    def address(self, node: int) -> str:
        return f"10.0.0.{node + 2}"

    def exec(self, node: int, argv: list[str]) -> tuple[int, str]:
        self.execs.append((node, argv))
        return self.exit_code, "iptables: oops" if self.exit_code else ""

    def check(self, node: int, argv: list[str], what: str) -> str:
        code, out = self.exec(node, argv)
        if code:
            raise LabError(f"could not {what}: {out}")
        return out


def test_registry_names_every_mode():
    assert list(FAULTS) == ["kill", "pause", "partition", "host"]
    assert [FAULTS[m].NET_ADMIN for m in FAULTS] == [False, False, True, False]
    assert [FAULTS[m].TARGET_NOTICES for m in FAULTS] == [False, False, True, False]


def test_a_host_goes_away_with_every_node_on_it_at_once():
    cluster = _Cluster(3)
    for node, host in zip(cluster.nodes, ["host0", "host1", "host0"], strict=True):
        node.host, node.ranks = host, [node.index]
    fault = FAULTS["host"]()
    fault.prepare(cluster, 2)
    fault.inject()
    assert [n.container.calls for n in cluster.nodes] == [["kill"], [], ["kill"]]
    assert fault.detail == "host0 down: docker kill of node0, node2 at once (ranks [0, 2])"
    for node in cluster.nodes:
        node.host = "host0"
    with pytest.raises(ValueError, match="every node runs on host0, so no rank would be left"):
        FAULTS["host"]().prepare(cluster, 0)


def test_kill_is_one_docker_kill_and_leaves_nothing_to_release():
    cluster = _Cluster()
    with FAULTS["kill"]() as fault:
        fault.prepare(cluster, 1)
        fault.inject()
        assert fault.detail == "docker kill"
        # the fault's moment is the engine's kill event of this call, not an older one
        assert fault.landed_at == pytest.approx(cluster.nodes[1].container.killed_at, abs=1e-6)
        assert fault.release() is None
    assert [n.container.calls for n in cluster.nodes] == [[], ["kill"], []]
    assert cluster.execs == []


def test_pause_is_released_by_sigkill_never_by_unpause():
    cluster = _Cluster()
    fault = FAULTS["pause"]()
    fault.prepare(cluster, 2)
    assert fault.release() is None  # nothing injected, nothing to release
    fault.inject()
    assert "SIGKILLed" in fault.release()
    assert fault.release() is None  # idempotent
    assert cluster.nodes[2].container.calls == ["pause", "kill"]  # _Container has no unpause


def test_pause_released_on_error_even_when_the_container_is_gone():
    cluster = _Cluster(fail_kill=True)
    with pytest.raises(RuntimeError, match="boom"), FAULTS["pause"]() as fault:
        fault.prepare(cluster, 0)
        fault.inject()
        raise RuntimeError("boom")  # the original error, not the release's, comes out
    assert cluster.nodes[0].container.calls == ["pause", "kill"]


def test_inject_before_prepare_is_an_error():
    for mode in FAULTS:
        with pytest.raises(RuntimeError, match="prepare"):
            FAULTS[mode]().inject()
    with pytest.raises(ValueError, match=r"node must be in 0\.\.2"):
        FAULTS["kill"]().prepare(_Cluster(), 3)


def test_partition_prepares_ahead_cuts_fast_and_undoes_exactly():
    cluster = _Cluster()
    with FAULTS["partition"]() as fault:
        fault.prepare(cluster, 1)
        assert len(cluster.execs) == 1  # the chain, built before training
        fault.inject()
        assert fault.detail == "iptables DROP to and from 10.0.0.2, 10.0.0.4"
    assert fault.release() is None  # released by the context manager already, once
    prepare, cut, undo = (argv for _, argv in cluster.execs)
    assert all(node == 1 for node, _ in cluster.execs)
    assert prepare[2].startswith(f"iptables -w 5 -N {CHAIN} && ")
    assert cut == [
        "sh",
        "-c",
        f"iptables -w 5 -I INPUT 1 -j {CHAIN} && iptables -w 5 -I OUTPUT 1 -j {CHAIN}",
    ]
    assert undo[2].count(" ; ") == 3 and undo[2].endswith(f"-X {CHAIN}")


def test_partition_that_cannot_be_prepared_says_what_to_do_and_still_undoes():
    cluster = _Cluster(exit_code=4)
    fault = FAULTS["partition"]()
    with pytest.raises(LabError, match="NET_ADMIN and iptables"):
        fault.prepare(cluster, 0)
    assert "partition rules removed" in fault.release()  # a half-built chain goes too
    assert "-X" in cluster.execs[-1][1][2]


def test_partition_commands_cut_both_directions():
    prepare, _, undo = partition_commands(["172.30.0.2", "172.30.0.4"])
    assert [c[4:] for c in prepare[1:]] == [
        [CHAIN, "-s", "172.30.0.2", "-j", "DROP"],
        [CHAIN, "-d", "172.30.0.2", "-j", "DROP"],
        [CHAIN, "-s", "172.30.0.4", "-j", "DROP"],
        [CHAIN, "-d", "172.30.0.4", "-j", "DROP"],
    ]
    assert [c[3:] for c in undo] == [
        ["-D", "INPUT", "-j", CHAIN],
        ["-D", "OUTPUT", "-j", CHAIN],
        ["-F", CHAIN],
        ["-X", CHAIN],
    ]
    with pytest.raises(ValueError, match="at least one peer"):
        partition_commands([])
    assert shell_script([["echo", "a b"], ["true"]]) == ["sh", "-c", "echo 'a b' && true"]
