"""``--mode kill``: SIGKILL of the rank's container (``docker kill``).

The process dies without a word and the kernel closes its sockets, so the peers that talk to
it directly notice at once ("connection closed"); nothing is left to release: the container
stays stopped until the next phase restarts it.

When did it die? The Docker call takes 0.2-0.6 s on a busy host, and the signal lands
somewhere inside it. The engine logs a ``kill`` event once the signal was sent (measured here
under load: 40-80 ms after the call began, the ``die`` event 60 ms later, the call returning
100-200 ms after that), so ``landed_at`` is that event's time: the signal came no later.
"""

from __future__ import annotations

import time

import docker.errors

from lab.faults.base import Fault

__all__ = ["Kill"]


class Kill(Fault):
    NAME = "kill"
    HELP = "SIGKILL of the rank's container (docker kill): its peers notice at once"
    ROLE = "SIGKILLed"

    def inject(self) -> None:
        container = self._container()
        began = time.time()
        container.kill()
        self.detail = "docker kill"
        try:  # only a finer timestamp: the fault itself is done
            events = container.client.events(
                since=began - 1.0,
                until=time.time() + 0.05,
                decode=True,
                filters={"container": container.id, "event": "kill"},
            )
            sent = [e["timeNano"] / 1e9 for e in events if e["timeNano"] / 1e9 >= began - 0.01]
        except docker.errors.DockerException:
            sent = []
        self.landed_at = min(sent, default=None)
