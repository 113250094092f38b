"""The in-kernel shaper: netem delay on each node's egress, a tbf rate limit below it; and the
``tc`` argv of both (the NFQUEUE shaper uses the tbf on its own).

netem is missing from many kernels (microVMs, minimal builds; this lab's host is one). Its
absence shows up only as an error text from ``tc`` that differs between iproute2/kernel
versions, so the probe recognises the known texts and raises on anything else rather than
guessing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from lab.shaping.base import Node, Runner, Shaper, ShapingError, check
from lab.shaping.impair import Impairments

__all__ = [
    "NETEM_MISSING_TEXTS",
    "Netem",
    "is_netem_missing",
    "netem_add",
    "probe_netem",
    "qdisc_del_root",
    "tbf_add",
]

# Error texts tc prints when the kernel has no sch_netem, by iproute2/kernel generation:
# extack text on recent kernels, the older "qdisc not found" wording, and the bare ENOENT of
# kernels without extack (the qdisc module lookup fails with -ENOENT).
NETEM_MISSING_TEXTS = (
    "Specified qdisc kind is unknown",
    "Specified qdisc not found",
    "RTNETLINK answers: No such file or directory",
)


def netem_add(
    dev: str, delay_ms: float, handle: str = "1:", impair: Impairments | None = None
) -> list[str]:
    """`tc` argv adding a root netem qdisc that delays every packet leaving `dev` by `delay_ms`,
    with `impair`'s jitter (``delay 10ms 2ms distribution normal``) and loss (``loss 1%``).

    The handle lets a tbf be attached below it (``tbf_add(dev, rate, parent=handle)``). netem
    reorders jittered packets unless a rate or a FIFO child keeps them in line; the tbf below
    it does, and the NFQUEUE delayer always keeps order.
    """
    if not delay_ms >= 0:
        raise ValueError(f"delay must be >= 0 ms, got {delay_ms!r}")
    extra = impair.netem_args() if impair else []
    return _qdisc("add", dev, "root", "handle", handle, "netem", "delay", f"{delay_ms:g}ms", *extra)


def _tbf_burst_bytes(rate_mbit: float) -> int:
    # A burst of ~10 ms worth of tokens (never below 16 KiB) lets tbf reach its rate with
    # coarse timers; a smaller one caps throughput below the asked rate.
    return max(16 * 1024, int(rate_mbit * 1e6 / 8 * 0.010))


def tbf_add(
    dev: str, rate_mbit: float, parent: str | None = None, latency_ms: float = 50.0
) -> list[str]:
    """`tc` argv adding a tbf rate limit of `rate_mbit` on `dev` (root, or below `parent`).

    `latency_ms` bounds the queue tbf keeps before dropping, which is what TCP reacts to.
    """
    if not rate_mbit > 0:
        raise ValueError(f"rate must be > 0 Mbit/s, got {rate_mbit!r}")
    where = ["parent", parent] if parent else ["root"]
    rate = ["rate", f"{rate_mbit:g}mbit", "burst", str(_tbf_burst_bytes(rate_mbit))]
    return _qdisc("add", dev, *where, "tbf", *rate, "latency", f"{latency_ms:g}ms")


def qdisc_del_root(dev: str) -> list[str]:
    """`tc` argv removing the root qdisc of `dev` (and everything below it): undoes both adds."""
    return _qdisc("del", dev, "root")


def _qdisc(verb: str, dev: str, *rest: str) -> list[str]:
    return ["tc", "qdisc", verb, "dev", dev, *rest]


def is_netem_missing(text: str) -> bool:
    """True if `tc` output `text` says the kernel has no netem qdisc."""
    return any(marker in text for marker in NETEM_MISSING_TEXTS)


def probe_netem(run: Runner, dev: str = "eth0") -> tuple[bool, str]:
    """Try to add and delete a netem qdisc on `dev`; return (available, tc's error text).

    Run it before any shaping is applied: the add replaces the device's default root qdisc and
    the delete restores it. Raises ShapingError when tc fails for another reason (no such device,
    no NET_ADMIN, ...), since falling back then would hide a broken set-up.
    """
    code, out = run(netem_add(dev, 1.0))
    if code != 0:
        if is_netem_missing(out):
            return False, out.strip()
        raise ShapingError(f"netem probe on {dev} failed (exit {code}): {out.strip()}")
    code, out = run(qdisc_del_root(dev))
    if code != 0:
        raise ShapingError(
            f"netem probe added a qdisc on {dev} but could not delete it (exit {code}): "
            f"{out.strip()}; remove it with: {' '.join(qdisc_del_root(dev))}"
        )
    return True, ""


class Netem(Shaper):
    """netem on the egress of every node: a round trip crosses two, so it grows by 2 x ms."""

    name = "netem"

    @classmethod
    def available(cls, run: Runner, dev: str) -> tuple[bool, str]:
        return probe_netem(run, dev)

    def steps(self, node: Node, peers: Sequence[str], undo: contextlib.ExitStack) -> None:
        check(node, netem_add(node.dev, self.ms, impair=self.impair))
        # Removing the root qdisc removes the tbf below it too: one undo for both.
        undo.callback(check, node, qdisc_del_root(node.dev))
        if self.rate_mbit:
            check(node, tbf_add(node.dev, self.rate_mbit, parent="1:"))
