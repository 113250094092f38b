"""gloo's errors by their meaning: what a failed collective tells the rank that got it.

gloo's messages carry its source location (``[/__w/pytorch/.../pair.cc:553]``) and run on for a
paragraph; a diagnosis quotes what they mean instead, with the peer's address when gloo names
one. Pure and torch-free: the lab's reports use it too.
"""

from __future__ import annotations

import re

__all__ = ["error_meaning", "strip_source"]

# gloo prefixes its errors with its source location: "[/__w/.../gloo/transport/tcp/pair.cc:553] "
_SOURCE = re.compile(r"\[[\w./-]*\.(?:cc|cpp|c|h|hpp):\d+\]\s*")
_PEER = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3})\]?:(\d+)")
# What each raw error means for the rank that got it, most specific first.
_MEANINGS = (
    ("connection closed by peer", "the peer{at} closed the connection"),
    ("connection reset", "the connection was reset by the peer{at}"),
    ("connection refused", "the peer{at} refused the connection"),
    ("broken pipe", "the peer{at} closed the connection"),
    ("timed out", "timed out waiting for the peers"),
    ("timeout", "timed out waiting for the peers"),
)


def strip_source(text: str) -> str:
    """``text`` without gloo's source locations."""
    return _SOURCE.sub("", text)


def error_meaning(error: str | None) -> str:
    """A collective's raw error as what it means, with the peer's address when gloo names one:
    ``the peer at 172.18.0.4:41234 closed the connection``. Unknown errors are quoted whole
    (first line), without gloo's source paths and never cut mid-sentence."""
    if not error or not error.strip():
        return ""
    text = strip_source(error.strip().splitlines()[0]).strip()
    lowered = text.lower()
    for needle, meaning in _MEANINGS:
        if needle in lowered:
            peer = _PEER.search(text)
            return meaning.format(at=f" at {peer.group(1)}:{peer.group(2)}" if peer else "")
    return text
