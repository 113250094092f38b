"""`tc` command construction (netem delay, tbf rate limit), the netem probe and the shaper choice.

Everything here builds argv lists and runs them through a ``Runner`` -- a callable taking an argv
and returning ``(exit_code, output_text)`` -- so the same code drives the local host, a network
namespace (``ip netns exec NS ...``) or a container (``container.exec_run``). Nothing here needs
root by itself; the runner's target needs NET_ADMIN.

netem is missing from many kernels (microVMs, minimal builds; this lab's host is one). Its absence
shows up only as an error text from ``tc`` that differs between iproute2/kernel versions, so the
probe recognises the known texts and raises on anything else rather than guessing.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "NETEM_MISSING_TEXTS",
    "SHAPERS",
    "Runner",
    "ShaperChoice",
    "ShapingError",
    "choose_shaper",
    "is_netem_missing",
    "netem_add",
    "probe_netem",
    "qdisc_del_root",
    "run_local",
    "tbf_add",
]

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], tuple[int, str]]

SHAPERS = ("auto", "netem", "nfqueue")

# Error texts tc prints when the kernel has no sch_netem, by iproute2/kernel generation:
# extack text on recent kernels, the older "qdisc not found" wording, and the bare ENOENT of
# kernels without extack (the qdisc module lookup fails with -ENOENT).
NETEM_MISSING_TEXTS = (
    "Specified qdisc kind is unknown",
    "Specified qdisc not found",
    "RTNETLINK answers: No such file or directory",
)


class ShapingError(RuntimeError):
    """A shaping command failed for a reason other than a missing netem module."""


@dataclass(frozen=True)
class ShaperChoice:
    """The shaper to use and, when ``auto`` fell back, the one line saying why (else "")."""

    shaper: str
    note: str = ""


def run_local(argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
    """Runner for the local host: run argv, return (exit code, stdout+stderr as text)."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _check_ms(ms: float) -> None:
    if not ms >= 0:
        raise ValueError(f"delay must be >= 0 ms, got {ms!r}")


def netem_add(dev: str, delay_ms: float, handle: str = "1:") -> list[str]:
    """`tc` argv adding a root netem qdisc that delays every packet leaving `dev` by `delay_ms`.

    The handle lets a tbf be attached below it (``tbf_add(dev, rate, parent=handle)``).
    """
    _check_ms(delay_ms)
    return ["tc", "qdisc", "add", "dev", dev, "root", "handle", handle,
            "netem", "delay", f"{delay_ms:g}ms"]  # fmt: skip


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
    return ["tc", "qdisc", "add", "dev", dev, *where, "tbf", "rate", f"{rate_mbit:g}mbit",
            "burst", str(_tbf_burst_bytes(rate_mbit)), "latency", f"{latency_ms:g}ms"]  # fmt: skip


def qdisc_del_root(dev: str) -> list[str]:
    """`tc` argv removing the root qdisc of `dev` (and everything below it): undoes both adds."""
    return ["tc", "qdisc", "del", "dev", dev, "root"]


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


def choose_shaper(requested: str, run: Runner, dev: str = "eth0") -> ShaperChoice:
    """Resolve ``--shaper auto|netem|nfqueue`` against what the kernel behind `run` offers.

    ``auto`` prefers netem (in-kernel, no extra process) and falls back to nfqueue with a one-line
    note; an explicit ``netem`` on a kernel without it is an error, not a silent fallback.
    """
    if requested not in SHAPERS:
        raise ValueError(f"unknown shaper {requested!r}; choose one of {', '.join(SHAPERS)}")
    if requested == "nfqueue":
        return ShaperChoice("nfqueue")
    available, why = probe_netem(run, dev)
    if available:
        return ShaperChoice("netem")
    if requested == "netem":
        raise ShapingError(
            f"--shaper netem asked but this kernel has no netem ({why}); "
            "use --shaper nfqueue or --shaper auto"
        )
    first = why.splitlines()[0] if why else "tc netem failed"
    note = f"netem is missing in this kernel (tc: {first}); using the nfqueue delayer"
    log.info(note)
    return ShaperChoice("nfqueue", note)
