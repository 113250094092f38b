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
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ddp.flight.recorder import FlightRecorder
from ddp.instrument.env import DUMP_SIGNAL

__all__ = ["DumpTriggers"]


def _ignore(signum: int, frame: Any) -> None:
    """The Python-level handler: the reader thread does the work."""


class DumpTriggers:
    """Starts and stops both triggers of one recorder dumping into ``directory``."""

    def __init__(self, recorder: FlightRecorder, directory: str | Path) -> None:
        self.recorder = recorder
        self.directory = Path(directory)
        self.signal_armed = False
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
                try:
                    self.dump("requested")
                except OSError as e:
                    print(f"ddp.instrument: requested dump failed: {e}", file=sys.stderr)

    def dump(self, reason: str) -> Path:
        return self.recorder.dump(self.directory, reason)

    def stop(self) -> None:
        """Stop the file watcher; the signal's reader thread is a daemon and ends with the
        process (closing its pipe under it would hand the fd number to someone else)."""
        self.recorder.stop_watching()
