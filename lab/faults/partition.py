"""``--mode partition``: iptables DROP of the rank's traffic to and from every other node.

A chain that drops every packet to or from a peer is built ahead (``prepare``), unused; the
injection hooks it into INPUT and OUTPUT, two fast commands in one exec, so the partition
lands within the step delay; ``release`` unhooks and deletes it. Stateless DROP also stops
established gloo connections, and nothing is rejected: every rank sees silence, as with a
real partition, and times out, the cut-off rank too. Needs CAP_NET_ADMIN and iptables.
"""

from __future__ import annotations

import contextlib
import shlex
from typing import TYPE_CHECKING

from lab.engine.client import GONE, LabError
from lab.faults.base import Fault

if TYPE_CHECKING:
    from lab.engine.cluster import Cluster

__all__ = ["CHAIN", "Partition", "partition_commands", "shell_script"]

CHAIN = "LAB_PARTITION"  # the cut rank's DROP rules live in their own chain
_HINT = "the container needs NET_ADMIN and iptables (rebuild the image with `python -m lab image`)"


def partition_commands(
    peer_ips: list[str],
) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """iptables argvs ``(prepare, cut, undo)`` that cut one container off from ``peer_ips``
    (run inside it, as root). ``undo`` removes exactly what ``prepare`` and ``cut`` added."""
    if not peer_ips:
        raise ValueError("a partition needs at least one peer address to cut off")
    ipt = ["iptables", "-w", "5"]
    prepare = [[*ipt, "-N", CHAIN]]
    for ip in peer_ips:
        prepare.append([*ipt, "-A", CHAIN, "-s", ip, "-j", "DROP"])
        prepare.append([*ipt, "-A", CHAIN, "-d", ip, "-j", "DROP"])
    cut = [[*ipt, "-I", chain, "1", "-j", CHAIN] for chain in ("INPUT", "OUTPUT")]
    undo = [[*ipt, "-D", chain, "-j", CHAIN] for chain in ("INPUT", "OUTPUT")]
    undo += [[*ipt, "-F", CHAIN], [*ipt, "-X", CHAIN]]
    return prepare, cut, undo


def shell_script(commands: list[list[str]], *, keep_going: bool = False) -> list[str]:
    """One ``sh -c`` argv running ``commands`` in order (one exec, not one per command);
    stops at the first failure unless ``keep_going`` (undo: remove whatever exists)."""
    joiner = " ; " if keep_going else " && "
    return ["sh", "-c", joiner.join(shlex.join(c) for c in commands)]


class Partition(Fault):
    NAME = "partition"
    HELP = "iptables DROP of its traffic to and from the other nodes: every rank times out"
    ROLE = "cut off"
    NET_ADMIN = True
    TARGET_NOTICES = True

    def __init__(self) -> None:
        super().__init__()
        self._cut: list[list[str]] = []
        self._undo: list[list[str]] | None = None

    def prepare(self, cluster: Cluster, node: int) -> None:
        super().prepare(cluster, node)
        peers = [cluster.address(n.index) for n in cluster.nodes if n.index != node]
        prepare, self._cut, undo = partition_commands(peers)
        self._undo = undo  # before running it: a chain built half-way is removed too
        cluster.check(node, shell_script(prepare), f"prepare the partition rules ({_HINT})")
        self.detail = f"iptables DROP to and from {', '.join(peers)}"

    def inject(self) -> None:
        if self.cluster is None or self.node is None or not self._cut:
            raise RuntimeError("partition: prepare(cluster, node) must come before inject()")
        code, out = self.cluster.exec(self.node, shell_script(self._cut))
        if code != 0:
            raise LabError(
                f"could not cut node{self.node} off (exit {code}): {out.strip()}; {_HINT}"
            )

    def release(self) -> str | None:
        if self._undo is None or self.cluster is None or self.node is None:
            return None
        undo, self._undo = self._undo, None
        code = None
        with contextlib.suppress(*GONE):  # a container that is gone took its rules with it
            code, _ = self.cluster.exec(self.node, shell_script(undo, keep_going=True))
        return f"partition rules removed (exit {code})" if code is not None else None
