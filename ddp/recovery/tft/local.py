"""``python -m ddp --recovery torchft``: the local run of ``ddp.recovery.local`` with torchft's
lighthouse in place of our coordinator (the process is still called ``coordinator``)."""

from __future__ import annotations

from ddp.recovery.local import LocalJob

__all__ = ["TorchftJob"]


class TorchftJob(LocalJob):
    """The lighthouse and the replica processes of one local torchft run."""

    def start_server(self) -> None:
        least = (self.world + 1) // 2  # a quorum of fewer than half is refused, as ours does
        self._start(
            "coordinator",
            "-m",
            "ddp.recovery.tft.lighthouse",
            "--port",
            str(self.port),
            "--min-replicas",
            str(least),
        )
