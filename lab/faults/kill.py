"""``--mode kill``: SIGKILL of the rank's container (``docker kill``).

The process dies without a word and the kernel closes its sockets, so the peers that talk to
it directly notice at once ("connection closed"); nothing is left to release: the container
stays stopped until the next phase restarts it.
"""

from __future__ import annotations

from lab.faults.base import Fault

__all__ = ["Kill"]


class Kill(Fault):
    NAME = "kill"
    HELP = "SIGKILL of the rank's container (docker kill): its peers notice at once"
    ROLE = "SIGKILLed"

    def inject(self) -> None:
        self._container().kill()
        self.detail = "docker kill"
