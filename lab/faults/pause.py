"""``--mode pause``: the rank's container is frozen (``docker pause``, like SIGSTOP).

A frozen rank keeps its sockets open, so its peers see silence, not an error: only the
collective timeout tells them. It is released by SIGKILL (``docker kill`` works on a paused
container) once the survivors exited, never by unpausing: resumed, it would run on against
peers that are gone and overwrite its flight dump with one that says nothing about the fault.
"""

from __future__ import annotations

import contextlib

from lab.engine.client import GONE
from lab.faults.base import Fault

__all__ = ["Pause"]


class Pause(Fault):
    NAME = "pause"
    HELP = "docker pause (frozen, like SIGSTOP): its peers wait for the collective timeout"
    ROLE = "paused"

    def __init__(self) -> None:
        super().__init__()
        self._paused = False

    def inject(self) -> None:
        container = self._container()
        self._paused = True  # before the call: a pause that half-happened is still released
        container.pause()
        self.detail = "docker pause"

    def release(self) -> str | None:
        if not self._paused:
            return None
        self._paused = False
        with contextlib.suppress(*GONE):  # already gone: nothing left to stop
            self._container().kill()
        return "the paused container was SIGKILLed (docker kill) after the survivors exited"
