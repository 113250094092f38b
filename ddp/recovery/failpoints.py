"""Failpoints: named moments of the live protocol at which a fault campaign makes one process
die or stall, where no signal sent from outside could land reliably (between the commit vote
and the optimizer step, in the middle of a heal).

The code under test calls ``failpoint("heal.sending", step=top)`` at such a moment. Unless the
process was started with ``DDP_FAILPOINT`` naming it, that call is one dict lookup and returns.
When it is armed, and every condition of the spec matches the call's context, the process
writes a :class:`Fired` line to ``DDP_FAILPOINT_LOG`` (the campaign's clock of the fault) and
sends itself SIGKILL (``kill``, the default) or SIGSTOP (``stop``: whoever reads the log sends
SIGCONT). Each armed failpoint fires once.

    DDP_FAILPOINT="step.voted@step=12"                     # SIGKILL after the vote of step 12
    DDP_FAILPOINT="rank.registering:stop;heal.receiving"   # held until SIGCONT, then dies healing

Torch-free: the spec is read when this module is first imported.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["ENV", "LOG_ENV", "Armed", "Fired", "failpoint", "parse", "read_fired", "spec"]

ENV = "DDP_FAILPOINT"
LOG_ENV = "DDP_FAILPOINT_LOG"
_ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


@dataclass(frozen=True)
class Armed:
    """One failpoint of the spec: its name, the context it must match, what it does."""

    name: str
    when: dict[str, str] = field(default_factory=dict)
    action: str = "kill"


@dataclass(frozen=True)
class Fired:
    """One line of ``DDP_FAILPOINT_LOG``: failpoint ``name`` fired in process ``pid`` at wall
    clock ``t`` (just before the signal), with the context of the call."""

    name: str
    action: str
    t: float
    pid: int
    context: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Fired:
        d = json.loads(text)
        return cls(d["name"], d["action"], float(d["t"]), int(d["pid"]), dict(d["context"]))


def spec(name: str, action: str = "kill", **when: object) -> str:
    """The ``DDP_FAILPOINT`` text of one failpoint (join several with ``;``)."""
    text = name + ("@" + ",".join(f"{k}={v}" for k, v in when.items()) if when else "")
    return text if action == "kill" else f"{text}:{action}"


def parse(text: str) -> dict[str, Armed]:
    """The failpoints of a ``DDP_FAILPOINT`` spec by name; ValueError saying what is wrong."""
    armed: dict[str, Armed] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        head, _, action = part.partition(":")
        name, _, cond = head.partition("@")
        action = action or "kill"
        if not name or action not in _ACTIONS:
            raise ValueError(
                f"{ENV}: bad failpoint {part!r}: expected NAME[@KEY=VALUE,...][:kill|stop]"
            )
        when = {}
        for item in filter(None, cond.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"{ENV}: bad condition {item!r} in {part!r}: expected KEY=VALUE")
            when[key] = value
        armed[name] = Armed(name, when, action)
    return armed


_ARMED = parse(os.environ.get(ENV, ""))


def failpoint(name: str, **context: object) -> None:
    """Fire failpoint ``name`` if this process was started with it armed (see the module)."""
    armed = _ARMED.get(name)
    if armed is None:
        return
    _fire(armed, context)


def _fire(armed: Armed, context: dict[str, object]) -> None:
    if any(str(context.get(k)) != v for k, v in armed.when.items()):
        return
    del _ARMED[armed.name]  # once: a stopped process that is continued goes on
    said = {k: str(v) for k, v in context.items()}
    line = Fired(armed.name, armed.action, time.time(), os.getpid(), said).to_json() + "\n"
    path = os.environ.get(LOG_ENV)
    if path:
        # One write of one short line with O_APPEND: processes sharing the log never interleave,
        # and the line is in the kernel's hands before the signal below ends this process.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    os.kill(os.getpid(), _ACTIONS[armed.action])


def read_fired(path: str | Path) -> list[Fired]:
    """Every failpoint that fired so far, in order (a missing log: none)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [Fired.from_json(line) for line in text.splitlines() if line.strip()]
