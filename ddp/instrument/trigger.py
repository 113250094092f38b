"""The flight recorder's dump on demand: on ``SIGUSR2`` or on a request file.

The moment a dump is wanted is a hang, when the main thread sits inside a collective in C++
and a Python signal handler would not run until it returns, i.e. never. So neither trigger
runs on the main thread:

* the request file (``ddp.flight.dumps.request_dumps``): the recorder's own ``watch`` thread
  polls it every 0.1 s;
* the signal: Python's C-level handler writes the signal's number to the wakeup fd
  (``signal.set_wakeup_fd``) from whichever thread the kernel chose, at once, and a daemon
  thread reading that pipe dumps. The Python-level handler does nothing. If the script
  already uses a wakeup fd (asyncio does), the signal is left alone and only the file works.

The dump is ``flight_rank<R>.json`` in the log directory, reason ``requested``, in
``ddp.flight``'s format, so ``ddp.flight.diagnosis`` reads it.

``SIGTERM`` too, if the script left it at its default: when one rank dies, torchrun's agent
ends the others with it, often before their failed collective has reached their exit handler,
and their dumps are what names the dead rank. So the rank dumps (reason ``exit``) and then
dies as it would have: the main thread, if free, by SIGTERM itself; if it is blocked inside a
collective, the reader thread ends the process after :data:`TERM_GRACE_S` with status 143
(128 + SIGTERM), as a shell reports a SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ddp.flight.recorder import FlightRecorder
from ddp.instrument.env import DUMP_SIGNAL

__all__ = ["TERM_GRACE_S", "DumpTriggers"]

TERM_GRACE_S = 1.0  # after SIGTERM's dump: how long the main thread has to end the process


def _ignore(signum: int, frame: Any) -> None:
    """The Python-level handler: the reader thread does the work."""


class DumpTriggers:
    """Starts and stops both triggers of one recorder dumping into ``directory``."""

    def __init__(self, recorder: FlightRecorder, directory: str | Path) -> None:
        self.recorder = recorder
        self.directory = Path(directory)
        self.signal_armed = False
        self.term_armed = False  # SIGTERM dumps too (the script left it at its default)
        self._pipe: tuple[int, int] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.recorder.watch(self.directory)
        if threading.current_thread() is threading.main_thread():
            self._arm_signal()

    def _arm_signal(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if previous != -1:  # the script's (asyncio's) wakeup fd: give it back, no signal
            signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
            return
        signal.signal(DUMP_SIGNAL, _ignore)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_term)
            self.term_armed = True
        self._pipe = (r, w)
        self._reader = threading.Thread(
            target=self._read, args=(r,), name="ddp-instrument-dump-signal", daemon=True
        )
        self._reader.start()
        self.signal_armed = True

    def _read(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            if int(DUMP_SIGNAL) in data:
                self._dump_quietly("requested")
            if self.term_armed and int(signal.SIGTERM) in data:
                self._dump_quietly("exit")
                time.sleep(TERM_GRACE_S)  # the main thread, if free, ends it by SIGTERM
                os._exit(128 + int(signal.SIGTERM))

    def _on_term(self, signum: int, frame: Any) -> None:
        """SIGTERM on the main thread (when it is free): dump, then die by SIGTERM."""
        self._dump_quietly("exit")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _dump_quietly(self, reason: str) -> None:
        try:
            self.dump(reason)
        except OSError as e:
            print(f"ddp.instrument: {reason} dump failed: {e}", file=sys.stderr)

    def dump(self, reason: str) -> Path:
        return self.recorder.dump(self.directory, reason)

    def stop(self) -> None:
        """Stop the file watcher; the signal's reader thread is a daemon and ends with the
        process (closing its pipe under it would hand the fd number to someone else)."""
        self.recorder.stop_watching()
