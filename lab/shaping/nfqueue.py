"""The userspace shaper, for kernels without netem: iptables sends every packet from a peer to
an NFQUEUE on the receiver's INPUT chain, and the delayer process (``python -m lab.node.delayer``,
started in the node) holds each one for ``ms`` before accepting it. This is the host side: the
rules, the delayer's argv, and the order of applying and undoing them.

Where the rule goes matters (measured on this lab's host): on OUTPUT a held packet stays charged
to the sending socket and TCP small queues allow ~2 packets per delay interval (~190 packets/s);
on the receiver's INPUT the sender never sees it, so TCP runs at full window. With the rule on
every node's INPUT, a one-way delay of D per packet gives a round trip of about 2*D -- the same
meaning ``--ms`` has with netem on every node's egress. ``--queue-bypass`` makes the rule accept
packets while no delayer is bound, so a dead delayer fails open instead of cutting the network.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from lab.shaping.base import Node, Shaper, ShapingError, background, check, node_path
from lab.shaping.impair import Impairments
from lab.shaping.netem import qdisc_del_root, tbf_add

__all__ = ["RULE_COMMENT", "Nfqueue", "delayer_argv", "nfqueue_rules_add", "nfqueue_rules_del"]

log = logging.getLogger(__name__)

RULE_COMMENT = "lab-shaping-delay"
_READY_S = 15.0  # how long a delayer may take to bind its queue
_STOP_S = 10.0  # how long it may take to accept what it holds and unbind


def _rule_spec(src: str, queue: int) -> list[str]:
    return [
        "!",
        "-i",
        "lo",
        "-s",
        src,
        "-m",
        "comment",
        "--comment",
        RULE_COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(queue),
        "--queue-bypass",
    ]


def nfqueue_rules_add(sources: Sequence[str], queue: int, chain: str = "INPUT") -> list[list[str]]:
    """iptables argvs sending packets from `sources` (addresses or CIDRs) to NFQUEUE `queue`.

    One rule per source, on the receiver's INPUT chain (see the module docstring), never for
    loopback, with --queue-bypass so packets flow undelayed when no delayer is bound.
    """
    if not sources:
        raise ValueError("sources is empty: give the other nodes' addresses or their subnet")
    return [["iptables", "-w", "5", "-I", chain, *_rule_spec(src, queue)] for src in sources]


def nfqueue_rules_del(sources: Sequence[str], queue: int, chain: str = "INPUT") -> list[list[str]]:
    """iptables argvs removing exactly the rules `nfqueue_rules_add` made."""
    return [["iptables", "-w", "5", "-D", chain, *_rule_spec(src, queue)] for src in sources]


def delayer_argv(
    queue: int,
    delay_ms: float,
    duration_s: float | None = None,
    pidfile: str | None = None,
    python: str = "python3",
    impair: Impairments | None = None,
) -> list[str]:
    """argv starting the delayer process in a node (needs ``lab`` importable there)."""
    argv = [python, "-m", "lab.node.delayer", "--queue", str(queue), "--delay-ms", f"{delay_ms:g}"]
    argv += impair.delayer_args() if impair else []
    if duration_s is not None:
        argv += ["--duration", f"{duration_s:g}"]
    if pidfile is not None:
        argv += ["--pidfile", pidfile]
    return argv


class Nfqueue(Shaper):
    """tbf (if a rate is asked), then the delayer, then the rules: the delayer is bound before
    the rules exist, so no packet ever waits on an unbound queue. Undone in reverse: rules
    first (new packets stop entering the queue), then the delayer (it accepts what it holds),
    then the qdisc."""

    name = "nfqueue"

    def steps(self, node: Node, peers: Sequence[str], undo: contextlib.ExitStack) -> None:
        if self.rate_mbit:
            check(node, tbf_add(node.dev, self.rate_mbit))
            undo.callback(check, node, qdisc_del_root(node.dev))
        if self.ms == 0 and not self.impair:
            return
        pidfile = node_path(node, "delay.pid")
        # Registered before the start: a delayer that started but never got ready is stopped
        # too (stopping one that never ran is a no-op).
        undo.callback(self._stop_delayer, node)
        background(
            node,
            delayer_argv(self.queue, self.ms, self.max_seconds, pidfile, self.python, self.impair),
            "delay",
        )
        self._wait_ready(node)
        for add, delete in zip(
            nfqueue_rules_add(peers, self.queue), nfqueue_rules_del(peers, self.queue), strict=True
        ):
            check(node, add)
            undo.callback(check, node, delete)

    def _wait_ready(self, node: Node) -> None:
        # The delayer writes its pidfile once the queue is bound: the readiness signal.
        loops, pid = int(_READY_S / 0.05), node_path(node, "delay.pid")
        wait = f"for i in $(seq {loops}); do [ -s {pid} ] && exit 0; sleep 0.05; done; exit 1"
        code, _ = node.run(["sh", "-c", wait])
        if code != 0:
            _, logtext = node.run(["cat", node_path(node, "delay.log")])
            raise ShapingError(
                f"{node.name}: delayer not ready after {_READY_S:g} s; its log: {logtext.strip()}"
            )

    def _stop_delayer(self, node: Node) -> None:
        # SIGTERM; the delayer deletes its pidfile once it has accepted what it held and
        # unbound, which is what the loop waits for.
        pid, loops = node_path(node, "delay.pid"), int(_STOP_S / 0.05)
        stop = (
            f"[ -s {pid} ] && kill -TERM $(cat {pid}); "
            f"for i in $(seq {loops}); do [ -e {pid} ] || break; sleep 0.05; done; "
            f"rm -f {pid}.sh; [ ! -e {pid} ]"
        )
        check(node, ["sh", "-c", stop])
        summary = node.run(["tail", "-n", "1", node_path(node, "delay.log")])[1].strip()
        log.debug("%s: %s", node.name, summary)
