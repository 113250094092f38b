"""Open a page in a real headless Chromium and report what a reader would see: whether every
image loaded, the console's errors, every request the page made, the headline's text, and a
screenshot.

Driven by the DevTools protocol over ``--remote-debugging-pipe`` (JSON messages, NUL-separated,
on file descriptors 3 and 4): the same protocol as the websocket of ``--remote-debugging-port``
with no websocket client to install and no port to find. Every wait has a deadline; the
browser is killed on the way out. Debian's package: ``apt-get install -y chromium``.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SKIP_REASON", "PageCheck", "check_page", "chromium"]

SKIP_REASON = "chromium not found: apt-get update && apt-get install -y chromium"
# Without the background-networking flags Chromium's own connections are refused by this
# machine's closed network (and retried, slowly).
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]
_PROBE = """JSON.stringify({
  images: Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,
                                                  width: i.naturalWidth})),
  command: (document.getElementById('command') || {}).textContent || '',
  verdict: (document.getElementById('verdict') || {}).textContent || '',
  figure: (document.getElementById('figure') || {}).textContent || '',
  text: document.body.innerText,
})"""


def chromium() -> str | None:
    return shutil.which("chromium")


@dataclass
class PageCheck:
    images: list[dict[str, Any]]
    command: str
    verdict: str
    figure: str
    text: str
    screenshot: Path
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for


class _Pipe:
    """One CDP connection: commands get ids, replies are matched, events are kept."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self._w, self._r, self._buf, self._id = to_browser, from_browser, b"", 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(
        self,
        method: str,
        params: dict | None = None,
        session: str | None = None,
        timeout: float = 30,
    ) -> dict[str, Any]:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
            out.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif e.get("method") == "Runtime.exceptionThrown":
            out.append(p["exceptionDetails"].get("text", "exception"))
        elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(p["entry"]["text"])
    return out


def _inspect(cdp: _Pipe, url: str, shot: Path, timeout: float) -> PageCheck:
    target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})
    sid = session["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        cdp.send(f"{domain}.enable", session=sid)
    cdp.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        session=sid,
    )
    cdp.events.clear()
    cdp.send("Page.navigate", {"url": url}, session=sid)
    cdp.wait_for("Page.loadEventFired", timeout)
    probe = cdp.send("Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=sid)
    found = json.loads(probe["result"]["value"])
    png = cdp.send(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True},
        session=sid,
        timeout=timeout,
    )
    shot.write_bytes(base64.b64decode(png["data"]))
    requests = [
        e["params"]["request"]["url"]
        for e in cdp.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    return PageCheck(
        found["images"],
        found["command"],
        found["verdict"],
        found["figure"],
        found["text"],
        shot,
        _errors(cdp.events),
        requests,
    )


def check_page(html: Path, out_dir: Path, timeout: float = 60) -> PageCheck:
    """Load ``html`` from disk in headless Chromium; the screenshot goes to ``out_dir``."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError(SKIP_REASON)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_r, to_w = os.pipe()  # we write, chromium reads on fd 3
    from_r, from_w = os.pipe()  # chromium writes on fd 4, we read

    def _fds() -> None:
        os.dup2(to_r, 3)
        os.dup2(from_w, 4)

    profile = out_dir / "chromium-profile"
    proc = subprocess.Popen(
        [exe, *_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_fds,
        close_fds=True,
        pass_fds=(3, 4),  # kept after _fds moved them there
    )
    os.close(to_r)
    os.close(from_w)
    try:
        cdp = _Pipe(to_w, from_r)
        return _inspect(cdp, Path(html).resolve().as_uri(), out_dir / "report.png", timeout)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        os.close(to_w)
        os.close(from_r)
