"""Progress of a run, honest on a terminal and off it.

On a terminal: a tqdm bar whose clock starts at the first step (container start-up and
rendezvous are not counted in its rate). Elsewhere (logs, CI): one line every ``every_s``
seconds, ``progress: step 7/20 (0.41 s/step)``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm

__all__ = ["Progress", "follow_steps"]


class Progress:
    def __init__(
        self,
        total: int,
        what: str = "step",
        enabled: bool = True,
        every_s: float = 5.0,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.total, self.what, self.every_s, self.echo = total, what, every_s, echo
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.done = 0
        self._bar: tqdm | None = None
        self._first: float | None = None
        self._printed = 0.0

    def update(self, done: int) -> None:
        """``done`` of ``total`` finished (e.g. rank 0's last reported step)."""
        if not self.enabled or done <= self.done:
            return
        now = time.monotonic()
        if self._first is None:
            # The clock starts at the first completed unit, so the rate is that of the work.
            self._first, self._printed = now, now
            if self.tty:
                self._bar = tqdm(total=self.total, unit=self.what, leave=False, dynamic_ncols=True)
        self.done = done
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif now - self._printed >= self.every_s or done == self.total:
            self._printed = now
            rate = (now - self._first) / (done - 1) if done > 1 else float("nan")
            per = f" ({rate:.2f} s/{self.what})" if done > 1 else ""
            self.echo(f"progress: {self.what} {done}/{self.total}{per}")

    def write(self, line: str) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            tqdm.write(line)
        else:
            self.echo(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def follow_steps(progress: Progress) -> Callable[[object], None]:
    """A job's ``echo`` that moves ``progress`` with rank 0's step records: rank 0 waits for
    every rank in each step, so its steps are the job's. ``record.rank``, not the line's rank
    label: under torchrun a node's stream carries several ranks."""
    from ddp.torchfree import StepRecord  # torch-free; lazily, to keep this module plain

    def follow(event: object) -> None:
        record = getattr(event, "record", None)
        if isinstance(record, StepRecord) and record.rank == 0:
            progress.update(record.step)

    return follow
