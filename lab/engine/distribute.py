"""The lab image on every host: streamed engine to engine, and checked before every run.

Images are per engine. ``python -m lab image --hosts ...`` builds once, on the first host, and
streams the image to every other engine through the SDK (``docker save`` from one, ``docker
load`` into the other, chunk by chunk, no file in between). Before a run across hosts,
:func:`require_same_image` refuses a host whose image is missing or differs from the first
host's (a stale copy would run other code than the one the run is judged by), naming the host
and the command that fixes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import docker.errors

import docker
from lab.engine.client import GONE, ImageMissing, LabError, require_image
from lab.engine.hosts import Host

__all__ = ["hosts_arg", "image_id", "require_same_image", "stream_image"]

_CHUNK = 4 << 20
_EVERY_S = 5.0  # a progress line at most this often


def hosts_arg(hosts: tuple[Host, ...] | list[Host]) -> str:
    """The ``--hosts`` value that names ``hosts`` again (for the commands errors suggest)."""
    return ",".join(
        (h.endpoint or "unix:///var/run/docker.sock") + (f"={h.address}" if h.address else "")
        for h in hosts
    )


def image_id(client: docker.DockerClient, image: str) -> str | None:
    """The image's id on this engine, or None if it has none by that name."""
    try:
        return client.images.get(image).id
    except docker.errors.ImageNotFound:
        return None


def require_same_image(members: list[tuple[Host, docker.DockerClient]], image: str) -> str:
    """The first host's image id; ImageMissing naming the first host whose copy is missing or
    differs, with the command that streams the first host's image to it."""
    first, client = members[0]
    require_image(client, image)
    want = image_id(client, image)
    fix = (
        f"python -m lab image --no-build --tag {image} --hosts {hosts_arg([h for h, _ in members])}"
    )
    for host, other in members[1:]:
        got = image_id(other, image)
        if got is None:
            raise ImageMissing(f"{host.shown} has no image {image}; copy it there: {fix}")
        if got != want:
            raise ImageMissing(
                f"{host.shown} has a stale {image} ({got[7:19]}, {first.name} has "
                f"{want[7:19]}); copy it there: {fix}"
            )
    assert want is not None
    return want


def _counted(chunks: Iterator[bytes], total: int, what: str, echo: Callable[[str], None]):
    sent, started, shown = 0, time.monotonic(), time.monotonic()
    for chunk in chunks:
        sent += len(chunk)
        yield chunk
        now = time.monotonic()
        if now - shown >= _EVERY_S:
            shown = now
            mib, rate = sent / 2**20, sent / 2**20 / (now - started)
            pct = f" ({100 * sent / total:.0f}% of {total / 2**20:.0f} MiB)" if total else ""
            echo(f"{what}: {mib:.0f} MiB sent{pct}, {rate:.0f} MiB/s")
    echo(f"{what}: {sent / 2**20:.0f} MiB sent in {time.monotonic() - started:.0f} s")


def stream_image(
    src: tuple[Host, docker.DockerClient],
    dst: tuple[Host, docker.DockerClient],
    image: str,
    echo: Callable[[str], None] = print,
) -> bool:
    """Copy ``image`` from ``src``'s engine to ``dst``'s unless it has the same id already;
    True if it was copied. Progress lines as it goes."""
    (src_host, src_client), (dst_host, dst_client) = src, dst
    require_image(src_client, image)
    want = image_id(src_client, image)
    if image_id(dst_client, image) == want:
        echo(f"{dst_host.shown}: {image} is there already ({want[7:19]})")
        return False
    if image_id(dst_client, want) == want:  # the same image under another name: tag it
        dst_client.images.get(want).tag(image)
        echo(f"{dst_host.shown}: {image} tagged, its image {want[7:19]} was there already")
        return False
    size = src_client.images.get(image).attrs.get("Size") or 0
    what = f"{image} {src_host.name} -> {dst_host.name}"
    try:
        tar = src_client.api.get_image(image, chunk_size=_CHUNK)
        for line in dst_client.api.load_image(_counted(tar, size, what, echo)):
            if "error" in line:
                raise LabError(f"{dst_host.shown} refused {image}: {line['error']}")
    except GONE as e:
        raise LabError(f"copying {image} to {dst_host.shown} failed: {e}") from None
    if image_id(dst_client, image) != want:
        raise LabError(f"{dst_host.shown} loaded {image} but its id differs from {src_host.name}'s")
    return True
