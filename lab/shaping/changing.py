"""A cluster's link that changes between jobs and during one: :class:`ChangingLink`.

An experiment that runs a limit job on the bare link, then the others on the shaped one, and
re-shapes the link while a job trains (``--change-at-step``) holds one of these for the whole
run. Each change clears what is applied and applies the new shaping with
:func:`lab.shaping.link.shaped`; with ``strict`` (an idle link, between jobs) it verifies
everything and a link that is not as asked stops the run, without (during a job) it shapes
every node at once, verifies the delay against the baseline measured on the idle link and
records what was off. Failures are
the :class:`~lab.engine.client.LabError` the CLI prints, as with
:func:`lab.shaping.verified_link.verified_link`.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from lab.engine.client import LabError
from lab.shaping import probe
from lab.shaping.across import round_trips
from lab.shaping.base import LinkMismatch, ShapingError, nodes_of
from lab.shaping.link import ShapingReport, shaped

__all__ = ["ChangingLink"]

Setting = tuple[float, float | None]  # (one-way ms, rate Mbit/s or None); (0, None): unshaped
# A strict check runs before every job that changes the link, many per run: on a loaded host
# the delayer now and then wakes late for a whole probe (measured here: 21 ms for 10 at a load
# of 30), so a mismatch is shaped and probed once more before it stops the run.
_ATTEMPTS = 2


class ChangingLink:
    """Every node of ``cluster`` shaped as last asked (at first: not at all); everything
    undone on the way out. ``max_seconds`` bounds what the shaping leaves in the nodes."""

    def __init__(
        self, cluster: Any, shaper: str, max_seconds: float, where: str = "between the nodes"
    ) -> None:
        self.cluster, self.shaper, self.max_seconds, self.where = (
            cluster,
            shaper,
            max_seconds,
            where,
        )
        self.nodes = nodes_of(cluster)
        self.setting: Setting = (0.0, None)  # fresh containers: the bare link
        self.verified = True  # the setting was verified on an idle link (the bare one is)
        self.baseline: dict[str, float] | None = None  # the idle link's unshaped round trip
        self._applied: contextlib.ExitStack | None = None
        self._across_checked = False
        self.retried: list[str] = []  # the mismatches a second attempt passed

    def __enter__(self) -> ChangingLink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.clear()

    def clear(self) -> None:
        """Undo whatever is applied: the bare link."""
        applied, self._applied = self._applied, None
        self.setting, self.verified = (0.0, None), True
        if applied is not None:
            try:
                applied.close()
            except ShapingError as e:
                raise LabError(f"undoing the shaping {self.where} failed: {e}") from None

    def set(
        self, ms: float, rate_mbit: float | None, *, strict: bool = True
    ) -> ShapingReport | None:
        """Clear, then shape every node at ``ms`` one-way (and ``rate_mbit``) and probe it; the
        probe's report, or None for the bare link (nothing to verify)."""
        self.clear()
        if ms == 0 and rate_mbit is None:
            return None
        across = None
        if strict and not self._across_checked:
            across, self._across_checked = round_trips(self.cluster), True
        applied = contextlib.ExitStack()
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                report = applied.enter_context(
                    shaped(
                        self.nodes,
                        ms,
                        self.shaper,
                        rate_mbit,
                        max_seconds=self.max_seconds,
                        baseline=None if strict else self.baseline,
                        strict=strict,
                        parallel=not strict,
                    )
                )
                break
            except LinkMismatch as e:  # undone by shaped(): shape and probe again, once
                if attempt == _ATTEMPTS:
                    raise LabError(
                        f"link check failed {self.where} ({attempt} attempts), nothing was "
                        f"measured: {e}"
                    ) from None
                self.retried.append(str(e))
            except ShapingError as e:
                raise LabError(f"shaping the link {self.where} failed: {e}") from None
        self._applied, self.setting, self.verified = applied, (ms, rate_mbit), strict
        self.shaper = report.shaper  # auto resolved: not probed for again
        if strict:
            self.baseline = dict(report.baseline)
        if across:
            report.checks.insert(0, across)
        return report

    def measure_baseline(self, port: int = 7411) -> None:
        """The bare link's round trip, for a change during the next job to be judged against
        (measured on the idle link; kept once known)."""
        if self.baseline is not None or self.setting != (0.0, None):
            return
        client, server = self.nodes[0], self.nodes[1]
        try:
            probe.start_server(server, port, 120.0)
            self.baseline = probe.ping(client, server, port)
        except ShapingError as e:
            raise LabError(f"probing the bare link {self.where} failed: {e}") from None
        finally:
            probe.stop_server(server)

    def ensure(self, ms: float, rate_mbit: float | None) -> ShapingReport | None:
        """The link at ``ms`` (and ``rate_mbit``), verified on the idle link: re-shaped unless
        it already is (then None, as for the bare link)."""
        if self.setting == (ms, rate_mbit) and self.verified:
            return None
        return self.set(ms, rate_mbit)
