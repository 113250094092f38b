"""Is a test's failure our class refusing an API on purpose, or a real failure?

The contract with ``ddp/`` (so the runner needs no list of what we support, and a test moves
to "pass" by itself once the API lands):

- ``NotImplementedError`` raised from inside the ``ddp`` package: a deliberate refusal; its
  message's first line names the API.
- ``TypeError`` "<OurClass>.__init__() got an unexpected keyword argument 'x'": torch's
  constructor argument ``x`` is not (yet) accepted; too many positional arguments likewise.
- ``AttributeError`` "'<OurClass>' object has no attribute 'x'" for a class defined in ``ddp``:
  torch's method or attribute ``x`` is missing.

Anything else is a failure, reported by the first line of its error. An exception that comes
back over RPC carries the remote one as text (``On WorkerInfo(...): TypeError("...")`` and its
traceback), so the patterns are searched in the whole message, not only at its start.
"""

from __future__ import annotations

import inspect
import re
import traceback
from pathlib import Path
from types import TracebackType

import ddp

__all__ = ["Outcome", "classify"]

Outcome = dict[str, object]

_DDP_DIR = str(Path(ddp.__file__).resolve().parent)
_KWARG = re.compile(r"\b(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
# ddp's own wording for an argument neither torch's DDP nor ddp knows
_UNKNOWN = re.compile(r"\b(\w+) got an unknown argument (\w+)=")
_POSITIONAL = re.compile(r"\b(\w+)\.__init__\(\) takes \d+ positional arguments? but \d+")
_ATTR = re.compile(r"'(\w+)' object has no attribute '(\w+)'")
_FILE = re.compile(r'File "([^"]+)", line \d+')


def _our_class_names() -> set[str]:
    """Names of the classes the ``ddp`` package defines (the wrapper, its reducer, ...)."""
    import importlib
    import pkgutil

    names = set()
    # every module of every subpackage (ddp.wrapper.distributed, ddp.program.loop, ...)
    for info in pkgutil.walk_packages(ddp.__path__, "ddp.", onerror=lambda _name: None):
        try:
            mod = importlib.import_module(info.name)
        except Exception:  # a module that cannot import here cannot have raised either
            continue
        names |= {
            n
            for n, obj in vars(mod).items()
            if inspect.isclass(obj) and obj.__module__ == mod.__name__
        }
    return names - {"__main__"}


def _in_ddp(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_DDP_DIR + "/")


def _raised_in_ddp(e: BaseException) -> bool:
    """The innermost frame of ``e``'s traceback (or of the remote traceback in its message)
    is in the ``ddp`` package."""
    remote = _FILE.findall(str(e))
    if remote:
        return _in_ddp(remote[-1])
    tb: TracebackType | None = e.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and _in_ddp(last.tb_frame.f_code.co_filename)


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.startswith("On WorkerInfo") and len(lines) > 1:  # RPC: the remote error is next
        text = f"{text} {lines[1]}"
    return f"{type(e).__name__}: {text}"[:300]


def _refusal(e: BaseException, ours: set[str]) -> str | None:
    """The API name if ``e`` is our class refusing it, else None."""
    msg = str(e).strip()
    if isinstance(e, NotImplementedError) and _raised_in_ddp(e):
        return msg.splitlines()[0] if msg else type(e).__name__
    if isinstance(e, TypeError):
        m = _KWARG.search(msg) or _UNKNOWN.search(msg)
        if m and m.group(1) in ours:
            return f"{m.group(2)}="
        m = _POSITIONAL.search(msg)
        if m and m.group(1) in ours:
            return "positional constructor arguments"
    if isinstance(e, AttributeError):
        m = _ATTR.search(msg)
        if m and m.group(1) in ours:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def classify(e: BaseException, *, check_refusal: bool) -> Outcome:
    """One rank's outcome for the exception its test raised. Exceptions chained as a cause or
    context (e.g. torch's wrappers re-raising) are searched for a refusal too."""
    ours = _our_class_names() if check_refusal else set()
    seen: set[int] = set()
    cur: BaseException | None = e
    while check_refusal and cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        api = _refusal(cur, ours)
        if api is not None:
            return {"status": "refused", "api": api, "reason": f"needs API: {api}"}
        cur = cur.__cause__ or cur.__context__
    return {
        "status": "fail",
        "reason": _first_line(e),
        "traceback": "".join(traceback.format_exception(e))[-4000:],
    }
